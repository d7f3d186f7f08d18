"""How much of a fast accelerator's throughput the serving layer can feed: served req/s against
the engine's own ceiling, mean batch size, and CPU microseconds per request for each process role.

    python -m benchmarks.accelerator_ceiling [--preset resnet50-h200] [--workers 1,2]
        [--protocols http-json,http-binary,grpc] [--seconds 5] [--connections 64]
        [--perf-analyzer PATH] [--triton-python /work/.venv-triton/bin/python]
        [--before CHECKOUT] [--rounds 1]

The identity model stands in for the accelerator: its delay settings make each batch take what
the real engine takes there (``resnet50-h200``: 0.3 ms + 0.0105 ms per request, max batch 256,
issue 41's figures for ResNet50 under TensorRT on an H200: ~85,000 requests/s at batch 256).
The engine is then as fast as the GPU and the only other work is the server's, so served ÷
ceiling says how far the serving layer is from feeding it, on this CPU.

For each front-end count N of ``--workers`` (``WATTSERVE_FRONTEND_WORKERS``; a checkout that
does not start N front ends for N > 1 is reported as such, never measured as if it did) and
each protocol: HTTP JSON and HTTP binary tensors with wrk (C, one thread), gRPC with
perf_analyzer (``--perf-analyzer``, or ``WATTSERVE_PERF_ANALYZER``; skipped with a line when
absent), closed loop at ``--connections``. Around each run: the CPU seconds (utime + stime,
/proc) of every process of the server's tree, grouped by role, divided by the requests served;
the model's executions and inferences from /metrics (Triton's ``nv_inference_count`` /
``nv_inference_exec_count``) for the mean batch size. ``--triton-python``: the same client
against Triton (PyTriton, ``benchmarks/triton_identity.py``) with the same delay, for
``tritonserver``'s own CPU per request.

``--before``: an older checkout's server measured the same way, alternating with this one's for
each N, ``--rounds`` times; the medians' after / before ratios are printed (same run, same load).

Prints a table and writes results/accelerator_ceiling.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import orjson

from benchmarks._harness import ROOT, free_port, process, save, wattserve_process, wrk


@dataclass(frozen=True)
class Preset:
    """An accelerator and model, as the identity engine's delay settings."""

    delay_ms: float
    delay_per_item_ms: float
    max_batch_size: int
    elements: int
    source: str

    def batch_seconds(self, size: int) -> float:
        return (self.delay_ms + self.delay_per_item_ms * size) / 1000.0

    def ceiling(self, size: int | None = None) -> float:
        """Requests per second the engine alone drains at batch ``size`` (default: max)."""
        size = size or self.max_batch_size
        return size / self.batch_seconds(size)


PRESETS = {
    "resnet50-h200": Preset(
        0.3, 0.0105, 256, 16, "issue 41: ResNet50, TensorRT, H200 (~85,000 req/s at 256)"
    ),
    "none": Preset(0.0, 0.0, 256, 16, "identity without delay: the server alone"),
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- /proc
def process_tree(root: int) -> list[int]:
    """``root`` and every descendant (children read from /proc/<pid>/task/*/children)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def role_of(pid: int, root: int) -> str:
    """The role a server process plays, from its command line: the first process is the
    server (front end and core together while there is one process); the rest are named by
    the ``--role`` / ``WATTSERVE_ROLE`` they were started with, else ``child``."""
    if pid == root:
        return "server"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    for i, arg in enumerate(cmdline):
        if arg == b"--role" and i + 1 < len(cmdline):
            return cmdline[i + 1].decode()
    for entry in environ:
        if entry.startswith(b"WATTSERVE_ROLE="):
            return entry.split(b"=", 1)[1].decode()
    name = Path(cmdline[0].decode(errors="replace")).name if cmdline and cmdline[0] else "child"
    return f"child:{name}"


def cpu_by_role(root: int) -> dict[str, float]:
    """CPU seconds so far of every process in ``root``'s tree, summed by role."""
    roles: dict[str, float] = {}
    for pid in process_tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = role_of(pid, root)
        roles[role] = roles.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return roles


def python_processes(root: int) -> int:
    return sum(1 for pid in process_tree(root) if _is_python(pid))


def _is_python(pid: int) -> bool:
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------- metrics
def executions(metrics_url: str, model: str = "identity") -> tuple[float, float]:
    """(inferences, executions) of ``model`` so far, from Triton's metric names."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    totals = {"nv_inference_count": 0.0, "nv_inference_exec_count": 0.0}
    for line in text.splitlines():
        match = re.match(r"(nv_inference_count|nv_inference_exec_count)\{([^}]*)\}\s+(\S+)", line)
        if match and f'model="{model}"' in match.group(2):
            totals[match.group(1)] += float(match.group(3))
    return totals["nv_inference_count"], totals["nv_inference_exec_count"]


def grouping(metrics_url: str) -> tuple[float, float]:
    """(requests that came in front ends' groups, groups) so far, all front ends (0, 0 for
    one process)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    totals = {"wattserve_frontend_grouped_requests_total": 0.0, "wattserve_frontend_groups_total": 0.0}
    for line in text.splitlines():
        match = re.match(r"(wattserve_frontend_grouped_requests_total|wattserve_frontend_groups_total)"
                         r"\{[^}]*\}\s+(\S+)", line)  # fmt: skip
        if match:
            totals[match.group(1)] += float(match.group(2))
    return totals["wattserve_frontend_grouped_requests_total"], totals["wattserve_frontend_groups_total"]


# ---------------------------------------------------------------- bodies and clients
def json_body(elements: int) -> bytes:
    data = [float(i) for i in range(elements)]
    return orjson.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, elements], "datatype": "FP32", "data": data}]}
    )


def binary_body(elements: int) -> tuple[bytes, dict[str, str]]:
    """What tritonclient.http sends with binary_data=True, output binary too."""
    array = np.arange(elements, dtype=np.float32).reshape(1, elements)
    header = orjson.dumps({
        "inputs": [{"name": "INPUT0", "shape": [1, elements], "datatype": "FP32",
                    "parameters": {"binary_data_size": array.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    })  # fmt: skip
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return header + array.tobytes(), headers


def perf_analyzer_grpc(
    tool: str, grpc_url: str, connections: int, seconds: float, headers: tuple[str, ...] = ()
) -> dict:
    """perf_analyzer over gRPC at ``connections`` concurrent requests: its throughput."""
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "pa.csv"
        # perf_analyzer measures in windows until three agree within the stability share
        cmd = [tool, "-m", "identity", "-u", grpc_url, "-i", "grpc", "--concurrency-range", str(connections),
               "--measurement-interval", str(int(seconds * 1000)), "-f", str(csv),
               "--stability-percentage", "25", "--max-trials", "6"]  # fmt: skip
        for header in headers:
            cmd += ["-H", header]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 10 + 60)
        if done.returncode != 0 or not csv.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise RuntimeError(f"perf_analyzer exited {done.returncode}: {' / '.join(tail)}")
        lines = csv.read_text().splitlines()
    header, row = lines[0].split(","), lines[1].split(",")
    record = dict(zip(header, row, strict=False))
    return {"rps": float(record["Inferences/Second"]), "non_2xx": 0,
            "p50_ms": float(record.get("p50 latency", 0)) / 1000, "p99_ms": float(record.get("p99 latency", 0)) / 1000}  # fmt: skip


@dataclass
class Target:
    """One server under test: its pids root, URLs and how its front ends were asked for."""

    name: str
    pid: int
    http: str
    grpc: str | None
    metrics: str
    workers: int
    grpc_headers: tuple[str, ...] = ()  # perf_analyzer -H KEY:VALUE (Triton's restricted APIs)


def projected_rps(cpu_us: dict[str, float], cores: int, ceiling: float) -> tuple[float, str]:
    """Requests/s on a host with ``cores`` cores, from the CPU each role spent per request
    here: one core feeds the engine core (or the one process), the other cores the front ends
    (the client is elsewhere); the engine's ceiling caps it. And which of the three binds."""
    if "core" in cpu_us and cpu_us.get("frontend"):
        limits = {"core": 1e6 / max(cpu_us["core"], 1e-9),
                  "front ends": (cores - 1) * 1e6 / cpu_us["frontend"]}  # fmt: skip
    else:
        limits = {"one process": 1e6 / max(sum(cpu_us.values()), 1e-9)}
    limits["engine"] = ceiling
    bound = min(limits, key=lambda name: limits[name])
    return limits[bound], bound


def measure(target: Target, protocol: str, args: argparse.Namespace, preset: Preset) -> dict | None:
    url = target.http + "/v2/models/identity/infer"
    before_cpu, before_exec = cpu_by_role(target.pid), executions(target.metrics)
    before_groups = grouping(target.metrics)
    started = time.monotonic()
    if protocol == "http-json":
        run = wrk(url, json_body(preset.elements), args.connections, args.seconds)
    elif protocol == "http-binary":
        body, headers = binary_body(preset.elements)
        run = wrk(url, body, args.connections, args.seconds, headers)
    elif protocol == "grpc":
        if not args.perf_analyzer or not target.grpc:
            return None
        try:
            run = perf_analyzer_grpc(
                args.perf_analyzer, target.grpc, args.connections, args.seconds, target.grpc_headers
            )
        except RuntimeError as exc:  # one failed run is reported, not the whole benchmark lost
            print(f"{target.name} grpc: {exc}")
            return None
    else:
        raise SystemExit(f"unknown protocol {protocol!r}")
    elapsed = time.monotonic() - started
    after_cpu, after_exec = cpu_by_role(target.pid), executions(target.metrics)
    grouped, groups = (
        after - before for after, before in zip(grouping(target.metrics), before_groups, strict=True)
    )
    inferences = after_exec[0] - before_exec[0]
    execs = after_exec[1] - before_exec[1]
    if run["non_2xx"]:  # wrk's req/s counts error answers too: only what was served counts
        run["rps"] = max(run["rps"] - run["non_2xx"] / elapsed, 0.0)
    served = inferences or run["rps"] * elapsed
    cpu_us = {role: (after_cpu.get(role, 0.0) - before_cpu.get(role, 0.0)) / served * 1e6
              for role in after_cpu} if served else {}  # fmt: skip
    return {
        **run,
        "server": target.name, "workers": target.workers, "protocol": protocol,
        "ceiling_share": run["rps"] / preset.ceiling(),
        "mean_batch": inferences / execs if execs else None,
        "mean_group": grouped / groups if groups else None,  # front ends' groups (N > 1)
        "grouped_share": grouped / served if served else None,
        "cpu_us_per_request": cpu_us,
        "cpu_us_per_request_total": sum(cpu_us.values()),
        "projected_cores": args.project_cores,
        "projected_rps": projected_rps(cpu_us, args.project_cores, preset.ceiling())[0],
        "projected_bound": projected_rps(cpu_us, args.project_cores, preset.ceiling())[1],
    }  # fmt: skip


@contextlib.contextmanager
def wattserve_target(
    workers: int, preset: Preset, args: argparse.Namespace, root: Path = ROOT, label: str = ""
) -> Iterator[Target]:
    grpc_port = free_port()
    env = {
        "WATTSERVE_MODEL": "identity", "WATTSERVE_BATCHER": args.batcher,
        "WATTSERVE_MAX_BATCH_SIZE": str(preset.max_batch_size), "WATTSERVE_MAX_QUEUE_DELAY_MS": "0",
        "WATTSERVE_MAX_QUEUE_SIZE": str(max(4 * args.connections, 1024)),
        "WATTSERVE_IDENTITY_ELEMENTS": str(preset.elements),
        "WATTSERVE_IDENTITY_DELAY_MS": str(preset.delay_ms),
        "WATTSERVE_IDENTITY_DELAY_PER_ITEM_MS": str(preset.delay_per_item_ms),
        "WATTSERVE_GRPC_PORT": str(grpc_port), "WATTSERVE_FRONTEND_WORKERS": str(workers),
    }  # fmt: skip
    with wattserve_process(env, root=root) as proc:
        yield Target(f"wattserve N={workers}{label}", proc.pid, proc.url, f"127.0.0.1:{grpc_port}",
                     proc.url + "/metrics", workers)  # fmt: skip


@contextlib.contextmanager
def triton_target(preset: Preset, args: argparse.Namespace) -> Iterator[Target]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    libdir = subprocess.run([args.triton_python, "-c", "import sys; print(sys.base_prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip() + "/lib"  # fmt: skip
    cmd = [args.triton_python, str(ROOT / "benchmarks" / "triton_identity.py"), "--http-port", str(http),
           "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--elements", str(preset.elements),
           "--max-batch-size", str(preset.max_batch_size), "--delay-ms", str(preset.delay_ms),
           "--delay-per-item-ms", str(preset.delay_per_item_ms)]  # fmt: skip
    env = {"LD_LIBRARY_PATH": libdir}
    # the model's readiness, not the server's: PyTriton binds the model after Triton is up
    with process(cmd, env, f"http://127.0.0.1:{http}/v2/models/identity/ready", timeout=300) as proc:
        token = access_token(proc.pid)
        headers = (f"triton-grpc-protocol-triton-access-token:{token}",) if token else ()
        yield Target("triton (PyTriton)", proc.pid, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}",
                     f"http://127.0.0.1:{metrics}/metrics", 1, headers)  # fmt: skip


def access_token(root: int) -> str | None:
    """The token PyTriton gave tritonserver for its restricted APIs (statistics, metadata
    that perf_analyzer asks for), read from tritonserver's command line."""
    for pid in process_tree(root):
        with contextlib.suppress(OSError):
            match = re.search(rb"triton-access-token=([\w\-]+)", Path(f"/proc/{pid}/cmdline").read_bytes())
            if match:
                return match.group(1).decode()
    return None


def engine_alone(preset: Preset, sizes: tuple[int, ...] = (64, 256), calls: int = 30) -> dict[int, float]:
    """Requests/s the identity engine itself drains at each batch size, measured in-process
    (the sleeps are the delay settings; what it costs beyond them is the copy)."""
    from wattserve.engines.identity import IdentityEngine

    engine = IdentityEngine(
        elements=preset.elements, max_batch_size=preset.max_batch_size,
        delay_s=preset.delay_ms / 1000, delay_per_item_s=preset.delay_per_item_ms / 1000,
    )  # fmt: skip
    out = {}
    for size in sizes:
        batch = {"INPUT0": np.ones((size, preset.elements), np.float32)}
        engine.infer(batch)
        start = time.perf_counter()
        for _ in range(calls):
            engine.infer(batch)
        out[size] = size * calls / (time.perf_counter() - start)
    return out


def print_before_after(rows: list[dict]) -> None:
    """After / before ratios of each (N, protocol)'s medians over the rounds: req/s and the
    CPU per request of each role."""
    print("\nafter / before, medians over the rounds (same run):")
    keys = sorted({(r["workers"], r["protocol"]) for r in rows if r["server"].startswith("wattserve")})
    for workers, protocol in keys:
        pick = [r for r in rows if r["workers"] == workers and r["protocol"] == protocol]
        after = [r for r in pick if not r["server"].endswith("(before)")]
        before = [r for r in pick if r["server"].endswith("(before)")]
        if not after or not before:
            continue
        rps = statistics.median(r["rps"] for r in after) / statistics.median(r["rps"] for r in before)
        parts = [f"req/s {rps:.3f}"]
        for role in sorted({role for r in after for role in r["cpu_us_per_request"]}):
            a, b = _median_cpu(after, role), _median_cpu(before, role)
            if a and b:
                parts.append(f"{role} CPU/request {a:.1f}/{b:.1f} us = {a / b:.3f}")
        print(f"N={workers} {protocol:<12} " + ", ".join(parts))


def _median_cpu(rows: list[dict], role: str) -> float:
    return statistics.median(r["cpu_us_per_request"].get(role, 0.0) for r in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="resnet50-h200")
    parser.add_argument("--workers", default="1", help="front-end counts, comma-separated (1..cores)")
    parser.add_argument("--protocols", default="http-json,http-binary,grpc")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--batcher", default="dynamic")
    parser.add_argument("--perf-analyzer", default=os.environ.get("WATTSERVE_PERF_ANALYZER"))
    parser.add_argument("--triton-python", help="Triton's venv python (scripts/triton_venv.sh)")
    parser.add_argument("--before", type=Path, help="an older checkout, measured alternating with this one")
    parser.add_argument("--rounds", type=int, default=1, help="times each server is measured (alternating)")
    parser.add_argument("--project-cores", type=int, default=16,
                        help="project each row's CPU per request onto a host with this many cores")  # fmt: skip
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("this benchmark needs wrk (Debian: apt-get install wrk)")
    preset = PRESETS[args.preset]
    protocols = args.protocols.split(",")
    if "grpc" in protocols and not args.perf_analyzer:
        print("grpc: skipped (no perf_analyzer: --perf-analyzer or WATTSERVE_PERF_ANALYZER)")
    alone = engine_alone(preset)
    print(f"preset {args.preset}: {preset.source}")
    print("engine ceiling: " + ", ".join(
        f"batch {b}: {preset.ceiling(b):,.0f} req/s modelled, {r:,.0f} measured" for b, r in alone.items()))  # fmt: skip
    rows: list[dict] = []
    refused: list[str] = []
    servers: list[tuple[str, int, Path, str]] = []
    for _ in range(args.rounds):
        for n in args.workers.split(","):
            if args.before is not None:
                servers.append(("wattserve", int(n), args.before.resolve(), " (before)"))
            servers.append(("wattserve", int(n), ROOT, ""))
        if args.triton_python:
            servers.append(("triton", 1, ROOT, ""))
    for kind, workers, root, label in servers:
        context = (
            wattserve_target(workers, preset, args, root, label)
            if kind == "wattserve"
            else triton_target(preset, args)
        )
        with context as target:
            if kind == "wattserve" and workers > 1 and python_processes(target.pid) < workers:
                refused.append(f"{target.name}: this checkout starts {python_processes(target.pid)} "
                               "server process(es); not measured")  # fmt: skip
                continue
            for protocol in protocols:
                if protocol == "http-json":  # warm-up, once per server
                    wrk(target.http + "/v2/models/identity/infer", json_body(preset.elements), 8, 1)
                row = measure(target, protocol, args, preset)
                if row is not None:
                    rows.append(row)
    print(
        f"\n{'server':<20} {'protocol':<12} {'req/s':>9} {'/ceiling':>9} {'batch':>6} {'p99 ms':>7} {'errors':>7}  CPU us/request by role"
    )
    for r in rows:
        roles = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["cpu_us_per_request"].items()))
        batch = f"{r['mean_batch']:.1f}" if r["mean_batch"] else "-"
        p99 = f"{r['p99_ms']:.1f}" if r.get("p99_ms") is not None else "-"
        print(f"{r['server']:<20} {r['protocol']:<12} {r['rps']:>9,.0f} {r['ceiling_share']:>9.3f} {batch:>6} {p99:>7} {r['non_2xx']:>7}  "
              f"{roles} (total {r['cpu_us_per_request_total']:.0f})"
              + (f"; groups of {r['mean_group']:.1f} ({r['grouped_share']:.0%} of requests)" if r.get("mean_group") else ""))  # fmt: skip
    print(f"\nprojected onto {args.project_cores} cores (one for the engine core or the one process, the "
          "rest for front ends; the client elsewhere):")  # fmt: skip
    for r in rows:
        print(f"{r['server']:<20} {r['protocol']:<12} {r['projected_rps']:>9,.0f} req/s = "
              f"{r['projected_rps'] / preset.ceiling():.2f} of the ceiling, bound by {r['projected_bound']}")  # fmt: skip
    for line in refused:
        print(line)
    if args.before is not None:
        print_before_after(rows)
    path = save("accelerator_ceiling", {
        "preset": args.preset, **asdict(preset), "engine_alone_rps": alone, "ceiling_rps": preset.ceiling(),
        "connections": args.connections, "seconds": args.seconds, "rows": rows, "refused": refused,
        "cores": os.cpu_count(), "command": " ".join([sys.executable, "-m", "benchmarks.accelerator_ceiling", *(argv or sys.argv[1:])]),
    })  # fmt: skip
    print(f"saved {path}")


if __name__ == "__main__":
    main()

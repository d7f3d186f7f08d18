"""The engine core's CPU per request alone: a core process driven over its channel, no HTTP.

``--frontend-workers N`` puts every request of a model through one engine-core process, so
on a host with many cores the core's CPU per request sets how many requests per second the
server can feed an accelerator (issue 41's goal: 15 us, one core feeding ~65,000/s). The
``accelerator_ceiling`` benchmark measures it with real front ends and a C client, where
the front ends' HTTP work shares the cores and moves the figure with the machine's load.
This one isolates the core: ``python -m wattserve.server.split core`` (the process the
supervisor starts) on the identity model, driven from this process by the front end's own
``CoreClient`` with ``--concurrency`` requests in flight, so nothing but the channel and the
core's admission, batching, engine call and answers is between the two. It prints the core's
CPU microseconds per request (``/proc/<pid>/stat``), requests/s, the mean batch size, and
this driver's CPU per request (what a front end spends on the channel alone).

    python -m benchmarks.core_cost [--seconds 4] [--rounds 3] [--concurrency 64]
        [--preset resnet50-h200|none] [--before CHECKOUT]

``--before`` runs an older checkout's core (and its ``CoreClient``, in a child driver from
that checkout) in alternating rounds, same preset: same-run before/after ratios.

``--sweep 16,64,128,256`` measures the core at each concurrency (each batch takes every request
in flight, so the concurrency is the batch size) and fits its CPU per batch as a fixed part plus
a part per request. Most of it is per batch, so the CPU per request at this machine's batch size
(``accelerator_ceiling`` forms ~20 on two cores) overstates what the core costs on a host whose
load forms larger batches. The sweep then finds the batch the preset's engine forms at each load
(a batch is what arrived during the one before: ``B = X * seconds(B)``, one instance, no queue
delay) and the core's share of one CPU there, up to the engine's ceiling: the throughput the core
alone could feed. Groups here are the front end's largest (max batch / 8); HTTP front ends on two
cores make groups of ~16, so a real core pays its per-group part more often.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._harness import ROOT, save
from benchmarks.accelerator_ceiling import CLK_TCK, PRESETS, Preset


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def core_settings(preset: Preset, concurrency: int) -> dict:
    return {
        "model": "identity", "identity_elements": preset.elements,
        "identity_delay_ms": preset.delay_ms, "identity_delay_per_item_ms": preset.delay_per_item_ms,
        "max_batch_size": preset.max_batch_size, "max_queue_delay_ms": 0.0,
        "max_queue_size": max(4 * concurrency, 1024), "telemetry": False, "grpc_port": 0,
        "log_level": "warning",
    }  # fmt: skip


async def drive(channel: str, core_pid: int, args: argparse.Namespace, elements: int) -> dict:
    """Closed-loop load over the channel; the core's and this process's CPU per request."""
    from wattserve.server.core.request import InferRequest
    from wattserve.server.split.core_client import CoreClient, RemoteRuntime

    client = CoreClient(channel, 64 << 20, 1)
    client.start()
    await asyncio.wait_for(client.connected.wait(), 60)
    info = None
    for _ in range(600):
        info = await client.describe("identity", None)
        if info is not None:
            break
        await asyncio.sleep(0.1)
    assert info is not None, "the core never described the identity model"
    remote = RemoteRuntime(client, info, None)
    values = np.arange(elements, dtype=np.float32).reshape(1, elements)
    served = 0
    batch_rows = 0
    measuring = False
    stop = False

    async def worker() -> None:
        nonlocal served, batch_rows
        while not stop:
            request = InferRequest(None, {"INPUT0": values}, True, 1)
            result = await remote.infer(remote.make_item(request))
            if measuring:
                served += 1
                batch_rows += result.batch_size

    workers = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
    await asyncio.sleep(args.warmup)
    measuring = True
    core_before, own_before, start = process_cpu_s(core_pid), time.process_time(), time.perf_counter()
    await asyncio.sleep(args.seconds)
    measuring = False
    elapsed = time.perf_counter() - start
    core_cpu, own_cpu = process_cpu_s(core_pid) - core_before, time.process_time() - own_before
    stop = True
    await asyncio.gather(*workers, return_exceptions=True)
    await client.close()
    return {
        "served": served,
        "rps": served / elapsed,
        "mean_batch": batch_rows / served if served else 0.0,
        "core_us_per_request": core_cpu / served * 1e6 if served else None,
        "core_cpu_share": core_cpu / elapsed,
        "driver_us_per_request": own_cpu / served * 1e6 if served else None,
    }


def one_round(root: Path, preset_name: str, args: argparse.Namespace) -> dict:
    """Start ``root``'s core, drive it with ``root``'s client (a child from ``root``)."""
    preset = PRESETS[preset_name]
    with tempfile.TemporaryDirectory(prefix="wattserve-core-cost-") as folder:
        os.chmod(folder, 0o700)
        env = {**os.environ, "WATTSERVE_SPLIT_DIR": folder,
               "WATTSERVE_SPLIT_SETTINGS": json.dumps(core_settings(preset, args.concurrency)),
               "PYTHONPATH": str(root)}  # fmt: skip
        profile = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        core = subprocess.Popen(
            [sys.executable, *profile, "-m", "wattserve.server.split", "core"], cwd=root, env=env
        )
        try:
            channel = os.path.join(folder, "core.sock")
            for _ in range(600):
                if os.path.exists(channel):
                    break
                time.sleep(0.1)
            # this file drives every checkout (an older one may not have it); the client it
            # imports is the checkout's own (PYTHONPATH)
            driver = [sys.executable, __file__, "--drive", channel, str(core.pid),
                      "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                      "--concurrency", str(args.concurrency), "--preset", preset_name]  # fmt: skip
            done = subprocess.run(driver, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                                  capture_output=True, text=True, timeout=args.seconds * 10 + 120)  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"driver from {root} failed:\n{done.stderr[-3000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])
        finally:
            core.terminate()
            try:
                core.wait(10)
            except subprocess.TimeoutExpired:
                core.kill()


def sweep(args: argparse.Namespace, concurrencies: list[int]) -> None:
    """The core's CPU per batch at each batch size, its fit, and the load it could feed."""
    preset = PRESETS[args.preset]
    points = []
    for concurrency in concurrencies:
        args.concurrency = concurrency
        figures = [one_round(ROOT, args.preset, args) for _ in range(args.rounds)]
        per_request = statistics.median(f["core_us_per_request"] for f in figures)
        batch = statistics.median(f["mean_batch"] for f in figures)
        points.append({"concurrency": concurrency, "mean_batch": batch, "core_us_per_request": per_request,
                       "core_us_per_batch": per_request * batch, "rounds": figures})  # fmt: skip
        print(f"batch {batch:6.1f}  core {per_request:6.1f} us/request = {per_request * batch:7.0f} us/batch  "
              f"(median of {args.rounds})", flush=True)  # fmt: skip
    slope, fixed = np.polyfit([p["mean_batch"] for p in points], [p["core_us_per_batch"] for p in points], 1)
    print(f"core CPU per batch ~ {fixed:.0f} us + {slope:.2f} us per request (least squares)")
    if preset.batch_seconds(1) <= 0:  # no engine time to form batches against
        return
    # The load X at which the engine forms batches of B, and the core's share of a CPU there.
    loads = []
    for size in range(1, preset.max_batch_size + 1):
        seconds = preset.batch_seconds(size)
        load = size / seconds  # requests/s that arrive during one batch of ``size``
        share = (fixed + slope * size) / (seconds * 1e6)
        loads.append((size, load, share))
    fed = [(size, load, share) for size, load, share in loads if share <= 1.0]
    top = max(fed, key=lambda entry: entry[1]) if fed else None
    for size in (16, 32, 64, 128, preset.max_batch_size):
        _, load, share = loads[size - 1]
        print(
            f"  engine forming batches of {size:3d}: {load:8,.0f} req/s, the core busy {share:.2f} of a CPU"
        )
    if top is not None:
        print(f"the core alone feeds up to {top[1]:,.0f} req/s = {top[1] / preset.ceiling():.2f} of the engine's "
              f"ceiling ({preset.ceiling():,.0f}), at batch {top[0]} ({top[2]:.2f} of a CPU)")  # fmt: skip
    save("core_cost_sweep", {"preset": args.preset, "seconds": args.seconds, "points": points,
                             "fixed_us_per_batch": fixed, "us_per_request": slope,
                             "feeds_rps": top[1] if top else 0.0, "ceiling_rps": preset.ceiling()})  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="requests in flight (64: accelerator_ceiling's wrk connections)",
    )
    ap.add_argument(
        "--sweep", help="concurrencies (= batch sizes), comma-separated: the core's CPU per batch"
    )
    ap.add_argument("--preset", default="resnet50-h200", choices=sorted(PRESETS))
    ap.add_argument("--before", type=Path, help="an older checkout, run in alternating rounds")
    ap.add_argument("--profile", metavar="FILE", help="run the core under cProfile, its stats to FILE")
    ap.add_argument("--drive", nargs=2, metavar=("CHANNEL", "CORE_PID"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.drive:  # the child: drive one core and print its figures as one JSON line
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        figures = asyncio.run(drive(args.drive[0], int(args.drive[1]), args, PRESETS[args.preset].elements))
        print(json.dumps(figures))
        return

    if args.sweep:
        sweep(args, [int(c) for c in args.sweep.split(",")])
        return
    targets = {"after": ROOT}
    if args.before is not None:
        targets = {"before": args.before.resolve(), "after": ROOT}
    runs: dict[str, list[dict]] = {name: [] for name in targets}
    for round_ in range(args.rounds):
        order = list(targets.items()) if round_ % 2 == 0 else list(reversed(targets.items()))
        for name, root in order:
            figures = one_round(root, args.preset, args)
            runs[name].append(figures)
            print(f"round {round_ + 1} {name:6s} core {figures['core_us_per_request']:6.1f} us/req  "
                  f"{figures['rps']:8.0f} req/s  batch {figures['mean_batch']:5.1f}  "
                  f"driver {figures['driver_us_per_request']:6.1f} us/req", flush=True)  # fmt: skip
    summary = {}
    for name, figures in runs.items():
        summary[name] = {key: statistics.median(f[key] for f in figures)
                         for key in ("core_us_per_request", "rps", "mean_batch", "driver_us_per_request")}  # fmt: skip
        s = summary[name]
        print(f"median {name:6s} core {s['core_us_per_request']:6.1f} us/req  {s['rps']:8.0f} req/s  "
              f"batch {s['mean_batch']:5.1f}  driver {s['driver_us_per_request']:6.1f} us/req")  # fmt: skip
    if "before" in summary:
        ratio = summary["after"]["core_us_per_request"] / summary["before"]["core_us_per_request"]
        print(f"core CPU per request, after / before (same run): {ratio:.3f}")
    save("core_cost", {"preset": args.preset, "concurrency": args.concurrency, "seconds": args.seconds,
                       "runs": runs, "median": summary})  # fmt: skip


if __name__ == "__main__":
    main()

"""torch vs ONNX Runtime on this CPU: per-batch-size engine throughput, then served throughput.

Part 1 calls each engine directly (no server) at batch sizes 1..32, the two engines
interleaved at every size so machine noise hits both alike. Part 2 starts a real wattserve
process per engine (``WATTSERVE_ENGINE=torch|onnxruntime``) and drives it closed-loop with
wrk (binary KServe v2 requests of one image), the same load for both.

glibc malloc: the process calls ``server.lifecycle.tune_malloc()`` (mallopt via ctypes, as
the server does at start) before any model is built, unless ``--no-tune-malloc``; the JSON
records which. Without it big batches page-fault on every call (mobilenet_v2 batch 32 measured
here: ~534k minor faults and ~950 ms a call, against ~310 ms tuned).

    python -m benchmarks.engines_cpu                      # everything, ~5-8 min here
    python -m benchmarks.engines_cpu --models mobilenet_v2 --skip-served
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "results" / "benchmarks" / "engines_cpu.json"


# ----------------------------------------------------------------------------- part 1


def time_engine(engine, batch_size: int, min_seconds: float, min_reps: int) -> dict:
    """Median and best seconds per call at ``batch_size`` after one warm-up call."""
    rng = np.random.default_rng(batch_size)
    batch = {"input": rng.standard_normal((batch_size, 3, 224, 224), dtype=np.float32)}
    engine.infer(batch)
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        engine.infer(batch)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return {
        "batch_size": batch_size,
        "reps": len(times),
        "median_s": median,
        "best_s": min(times),
        "images_per_s": batch_size / median,
    }


class OneThreadTorch:
    """The torch engine with intra-op threads set to 1 around each call (torch's setting is
    process-wide). On this shared 2-core box, OpenMP's 2-thread barriers stall whenever a
    neighbour holds the other core; one thread does not wait on anyone."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def infer(self, batch):
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self.engine.infer(batch)
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        pass


def build_engines(model: str, cache_dir: Path, threads: int | None, spin_variant: bool) -> dict:
    from wattserve.engines.onnx_export import ensure_onnx
    from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine
    from wattserve.engines.torch_engine import TorchVisionEngine
    from wattserve.server.settings import Settings

    settings = Settings(
        model=model, device="cpu", cache_dir=cache_dir, max_batch_size=32, torch_threads=threads
    )
    t0 = time.perf_counter()
    onnx_path = ensure_onnx(settings)
    print(f"  {model}: ONNX ready in {time.perf_counter() - t0:.1f}s ({onnx_path.name})", flush=True)
    torch_engine = TorchVisionEngine(model, device="cpu", max_batch_size=32, threads=threads)

    def ort(n_threads: int | None, spin: bool = False):
        return OnnxRuntimeEngine(
            onnx_path, name=model, max_batch_size=32, device="cpu", threads=n_threads, spin=spin
        )

    engines = {
        "torch": torch_engine,
        "onnxruntime": ort(threads),
        "torch 1t": OneThreadTorch(torch_engine),
        "onnxruntime 1t": ort(1),
    }
    if spin_variant:
        engines["onnxruntime+spin"] = ort(threads, spin=True)
    return engines


def run_engines(args: argparse.Namespace) -> list[dict]:
    rows = []
    for model in args.models:
        engines = build_engines(model, args.cache_dir, args.threads, args.spin_variant)
        for b in args.batch_sizes:
            for name, engine in engines.items():  # interleaved: same noise for both
                r = time_engine(engine, b, args.min_seconds, args.min_reps)
                rows.append({"model": model, "engine": name, **r})
                print(
                    f"  {model:<13} {name:<17} batch {b:>2}: {r['images_per_s']:7.1f} img/s "
                    f"(median {r['median_s'] * 1e3:7.1f} ms over {r['reps']})",
                    flush=True,
                )
        for engine in engines.values():
            engine.close()
    return rows


# ----------------------------------------------------------------------------- part 2


def image_request(model: str) -> tuple[bytes, dict[str, str]]:
    """One 3x224x224 FP32 image as a KServe v2 binary-extension request."""
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    raw = x.tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [1, 3, 224, 224],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + raw, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def wrk(url: str, body: bytes, headers: dict[str, str], connections: int, seconds: int) -> dict:
    """Closed-loop load with wrk (one C thread: costs the 2-core box little). Unlike
    benchmarks._harness.wrk it sets ``--timeout 30s``: wrk's default 2 s would drop slow
    answers (resnet50, torch under contention) from the latency histogram as socket errors."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "body.bin").write_bytes(body)
        lua = [
            'wrk.method = "POST"',
            f'local f = io.open("{tmp}/body.bin", "rb")',
            "wrk.body = f:read('*all')",
            "f:close()",
            *(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()),
        ]
        (Path(tmp) / "post.lua").write_text("\n".join(lua) + "\n")
        cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "30s", "--latency",
               "-s", f"{tmp}/post.lua", url]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result: dict = {"raw": out}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    result["requests_per_s"] = float(m.group(1)) if m else None
    m = re.search(r"(\d+) requests in", out)
    result["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non_2xx"] = int(m.group(1)) if m else 0
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}(?:\.000)?%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        result[f"p{pct}_s"] = float(m.group(1)) * _UNITS[m.group(2)] if m else None
    return result


def batch_stats(url: str, model: str) -> dict:
    """Mean batch size the server formed, from its own Prometheus histogram."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    count = total = 0.0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if family.name == "wattserve_batch_size":
            for s in family.samples:
                if s.name.endswith("_count"):
                    count += s.value
                elif s.name.endswith("_sum"):
                    total += s.value
    return {"batches": count, "inferences": total, "mean_batch_size": total / count if count else None}


def run_served(args: argparse.Namespace) -> list[dict]:
    if shutil.which("wrk") is None:
        print("  wrk not found (apt-get install wrk): served throughput skipped")
        return []
    from benchmarks._harness import wattserve

    rows = []
    for model in args.served_models:
        body, headers = image_request(model)
        for threads, engine in [(t, e) for t in args.served_threads for e in ("torch", "onnxruntime")]:
            env = {
                "WATTSERVE_MODEL": model,
                "WATTSERVE_ENGINE": engine,
                "WATTSERVE_DEVICE": "cpu",
                "WATTSERVE_CACHE_DIR": str(args.cache_dir.resolve()),
                "WATTSERVE_BATCHER": "dynamic",
                "WATTSERVE_MAX_BATCH_SIZE": str(args.served_max_batch),
                "WATTSERVE_MAX_QUEUE_DELAY_MS": str(args.served_delay_ms),
                "WATTSERVE_MAX_QUEUE_SIZE": "1024",
                "WATTSERVE_TUNE_MALLOC": "false" if args.no_tune_malloc else "true",
            }
            if threads:
                env["WATTSERVE_TORCH_THREADS"] = str(threads)
            with wattserve(env) as url:
                infer = f"{url}/v2/models/{model}/infer"
                wrk(infer, body, headers, args.connections, 3)  # warm: connections, allocator
                before = batch_stats(url, model)
                r = wrk(infer, body, headers, args.connections, args.served_seconds)
                after = batch_stats(url, model)
            batches = after["batches"] - before["batches"]
            inferences = after["inferences"] - before["inferences"]
            r.pop("raw")
            row = {"model": model, "engine": engine, "threads": threads or os.cpu_count(),
                   "connections": args.connections,
                   "max_batch_size": args.served_max_batch, "max_queue_delay_ms": args.served_delay_ms,
                   "seconds": args.served_seconds, **r,
                   "mean_batch_size": inferences / batches if batches else None}  # fmt: skip
            rows.append(row)
            p99 = f"{r['p99_s'] * 1e3:.0f} ms" if r["p99_s"] else "n/a"
            p50 = f"{r['p50_s'] * 1e3:.0f} ms" if r["p50_s"] else "n/a"
            print(
                f"  {model:<13} {engine:<12} threads {threads or 'all'}: {r['requests_per_s']:7.1f} req/s  "
                f"p50 {p50}  p99 {p99}  "
                f"mean batch {row['mean_batch_size'] or 0:.1f}  non-2xx {r['non_2xx']}",
                flush=True,
            )
    return rows


# ----------------------------------------------------------------------------- report


def print_engine_table(rows: list[dict]) -> None:
    models = sorted({r["model"] for r in rows}, key=[r["model"] for r in rows].index)
    engines = sorted({r["engine"] for r in rows}, key=[r["engine"] for r in rows].index)
    pairs = [(t, o) for t, o in (("torch", "onnxruntime"), ("torch 1t", "onnxruntime 1t")) if t in engines]
    for model in models:
        print(f"\n{model}: images/s, median of calls (best call in brackets); ratio = onnxruntime / torch")
        ratio_heads = [f"ratio {'1t' if t.endswith('1t') else 'all threads'}" for t, _ in pairs]
        print("| batch | " + " | ".join([*engines, *ratio_heads]) + " |")
        print("|---:|" + "---:|" * (len(engines) + len(pairs)))
        sizes = sorted({r["batch_size"] for r in rows if r["model"] == model})
        for b in sizes:
            sel = {r["engine"]: r for r in rows if r["model"] == model and r["batch_size"] == b}
            cells = [f"{sel[e]['images_per_s']:.1f} ({b / sel[e]['best_s']:.0f})" for e in engines]
            ratios = [f"{sel[o]['images_per_s'] / sel[t]['images_per_s']:.2f}x" for t, o in pairs]
            print(f"| {b} | " + " | ".join([*cells, *ratios]) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet50"])
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 2, 4, 8, 16, 32])  # fmt: skip
    parser.add_argument("--min-seconds", type=float, default=2.0, help="per engine per size")
    parser.add_argument("--min-reps", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="intra-op threads (default: all cores; '1t' rows use 1)"
    )
    parser.add_argument("--spin-variant", action="store_true", help="also time ORT with spinning on")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "wattserve")
    parser.add_argument("--no-tune-malloc", action="store_true")
    parser.add_argument("--skip-engines", action="store_true")
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--served-models", nargs="+", default=["mobilenet_v2"])
    parser.add_argument("--served-seconds", type=int, default=20)
    parser.add_argument("--served-max-batch", type=int, default=8)
    parser.add_argument("--served-delay-ms", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--served-threads",
        type=lambda v: [None if t == "all" else int(t) for t in v.split(",")],
        default=[None, 1],
        help="WATTSERVE_TORCH_THREADS values to serve with, e.g. all,1",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    tuned = False
    if not args.no_tune_malloc:
        from wattserve.server.lifecycle import tune_malloc

        tuned = tune_malloc()
    import onnxruntime
    import torch

    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "malloc_tuned": tuned,
        "threads": args.threads or os.cpu_count(),
        "command": " ".join(["python -m benchmarks.engines_cpu", *(argv or sys.argv[1:])]),
    }
    print(f"malloc thresholds raised: {tuned}; load average {meta['load_average_at_start']}")
    result: dict = {"meta": meta, "engines": [], "served": []}
    if not args.skip_engines:
        print("engines, called directly:")
        result["engines"] = run_engines(args)
        print_engine_table(result["engines"])
    if not args.skip_served:
        print(
            f"\nserved: closed loop, {args.connections} connections, one image per request, "
            f"dynamic batcher max {args.served_max_batch}, delay {args.served_delay_ms} ms, "
            f"{args.served_seconds} s"
        )
        result["served"] = run_served(args)
    meta["load_average_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

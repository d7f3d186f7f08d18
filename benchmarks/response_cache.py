"""The response cache's effect: requests/s, latency and joules per inference at 0%, 50% and
90% repeated inputs, cache on vs off, on one server in the same run.

    python -m benchmarks.response_cache [--repeats 0,0.5,0.9] [--duration 3] [--concurrency 8]

One repository, two copies of one model (the built-in identity with a compute delay per
batch and per request, standing in for an accelerator-bound model): ``cached`` enables
``response_cache``, ``plain`` does not; the server runs with ``--cache-config
local,size=16777216``. Each point is a closed loop of binary-extension requests whose inputs
repeat a small hot set with the given probability and are unique otherwise (a repeat is a
hit once the cache holds it). Joules per inference come from the server's energy meter
where one exists (a hit counts as an inference with zero engine energy); without one the
table says "none". Prints a table and saves results/response_cache.json.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from wattserve.loadgen import client
from wattserve.loadgen.payloads import PreparedRequest
from wattserve.loadgen.runner import LoadSpec, Target, run_load

from benchmarks._harness import save, wattserve

MODELS = {"plain": "", "cached": "response_cache { enable: true }"}
ELEMENTS = 64
CONFIG = """backend: "wattserve"
max_batch_size: 8
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "%d" } }
parameters { key: "identity_delay_ms" value: { string_value: "%s" } }
parameters { key: "identity_delay_per_item_ms" value: { string_value: "%s" } }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ %d ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ %d ] } ]
dynamic_batching { }
%s
"""


def build_repository(root: Path, delay_ms: float, per_item_ms: float) -> Path:
    for name, extra in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(
            CONFIG % (ELEMENTS, delay_ms, per_item_ms, ELEMENTS, ELEMENTS, extra)
        )
    return root


def binary_request(model: str, values: np.ndarray) -> PreparedRequest:
    raw = values.astype(np.float32).tobytes()
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, ELEMENTS], "datatype": "FP32",
                                       "parameters": {"binary_data_size": len(raw)}}]})  # fmt: skip
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return PreparedRequest(f"/v2/models/{model}/infer", header + raw, headers)


def requests_for(
    model: str, repeat: float, count: int, hot: int = 16, seed: int = 0
) -> list[PreparedRequest]:
    """``count`` requests (more than a point sends: the runner cycles through them in order),
    each one of ``hot`` inputs with probability ``repeat``, else an input used once."""
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal((hot, ELEMENTS))
    out = []
    for i in range(count):
        if rng.random() < repeat:
            values = pool[rng.integers(hot)]
        else:
            values = np.full(ELEMENTS, float(i)) + rng.standard_normal(ELEMENTS)
        out.append(binary_request(model, values))
    return out


async def measure(url: str, repeats: list[float], spec: LoadSpec, count: int) -> list[dict[str, Any]]:
    rows = []
    async with aiohttp.ClientSession() as session:
        for repeat in repeats:
            for model in MODELS:  # on and off at the same repeat fraction, one after the other
                metadata = await client.get_json(session, f"{url}/v2/models/{model}")
                reqs = requests_for(model, repeat, count, seed=int(repeat * 100))
                target = Target(url, model, "binary", reqs, f"{url}/metrics", metadata)
                result = await run_load(session, target, spec)
                s, server = result.summary, result.server or {}
                lat = s.get("latency_ms", {})
                rows.append({
                    "repeat": repeat, "cache": model == "cached", "throughput_rps": s.get("achieved_rate"),
                    "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"), "errors": s.get("failed"),
                    "computed_inferences": server.get("inferences"),
                    "cached_inferences": server.get("cached_inferences"),
                    "energy_per_inference_j": server.get("energy_per_inference_j"),
                    "energy_source": server.get("energy_source"),
                })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", default="0,0.5,0.9", help="fractions of requests that repeat an input")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per point")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=2.0, help="the model's compute time per batch")
    parser.add_argument("--per-item-ms", type=float, default=1.0, help="... plus this per request")
    parser.add_argument("--simulated-gpu", default="", help="WATTSERVE_SIMULATED_GPU (a power model, "
                        "figures labelled simulated) where no meter exists; default: none")  # fmt: skip
    args = parser.parse_args()
    repeats = [float(r) for r in args.repeats.split(",")]
    spec = LoadSpec(arrival="closed", concurrency=args.concurrency, duration_s=args.duration,
                    warmup_s=args.warmup, label=f"closed c={args.concurrency}")  # fmt: skip
    count = 20_000  # above what a point sends here (the runner would wrap around and repeat)
    with tempfile.TemporaryDirectory() as tmp:
        repo = build_repository(Path(tmp) / "repo", args.delay_ms, args.per_item_ms)
        env = {"WATTSERVE_MODEL_REPOSITORY": str(repo), "WATTSERVE_CACHE_CONFIG": "local,size=16777216",
               "WATTSERVE_WARMUP": "false"}  # fmt: skip
        if args.simulated_gpu:
            env["WATTSERVE_SIMULATED_GPU"] = args.simulated_gpu
        with wattserve(env) as url:
            rows = asyncio.run(measure(url, repeats, spec, count))
    print(f"{'repeated':>8} {'cache':>6} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'computed':>9} {'cached':>7} "
          f"{'J/inference':>12} {'errors':>6}")  # fmt: skip
    for r in rows:
        joules = f"{r['energy_per_inference_j']:.4g}" if r["energy_per_inference_j"] is not None else "none"
        print(f"{r['repeat']:>8.0%} {'on' if r['cache'] else 'off':>6} {r['throughput_rps'] or 0:>8.1f} "
              f"{r['p50_ms'] or 0:>8.2f} {r['p99_ms'] or 0:>8.2f} {r['computed_inferences'] or 0:>9.0f} "
              f"{r['cached_inferences'] or 0:>7.0f} {joules:>12} {r['errors'] or 0:>6}")  # fmt: skip
    for repeat in repeats:
        on = next(r for r in rows if r["repeat"] == repeat and r["cache"])
        off = next(r for r in rows if r["repeat"] == repeat and not r["cache"])
        if on["throughput_rps"] and off["throughput_rps"]:
            print(
                f"{repeat:.0%} repeated: cache on / off = {on['throughput_rps'] / off['throughput_rps']:.2f}x req/s"
            )
    print(f"saved {save('response_cache', {'args': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    main()

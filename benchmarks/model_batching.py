"""Engine-only throughput per batch size, and served throughput at saturation with each
batcher as a fraction of the engine-only figure at the same max batch.

    python -m benchmarks.model_batching [--model mobilenet_v2] [--max-batch 8] [--seconds 15]

Prints two tables and writes results/model_batching_<model>.json. Needs wrk.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import orjson
from wattserve.engines.torch_engine import TorchVisionEngine
from wattserve.server.lifecycle import tune_malloc

from benchmarks._harness import save, wattserve, wrk

ROUNDS = 3  # engine and served figures are each the best of this many rounds


def engine_throughput(
    model: str, sizes: list[int], seconds: float, channels_last: bool = True
) -> dict[int, float]:
    """Images per second of the bare engine, same process settings as the server."""
    tune_malloc()
    engine = TorchVisionEngine(model, device="auto", channels_last=channels_last)
    rng = np.random.default_rng(0)
    out: dict[int, float] = {}
    for size in sizes:
        batch = {"input": rng.standard_normal((size, 3, 224, 224), dtype=np.float32)}
        for _ in range(2):
            engine.infer(batch)
        rates = []
        for _ in range(ROUNDS):  # best of short rounds: this machine's neighbours come and go
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / ROUNDS or calls < 2:
                engine.infer(batch)
                calls += 1
            rates.append(calls * size / (time.perf_counter() - t0))
        out[size] = max(rates)
        print(
            f"  engine batch {size:>3} (channels_last={channels_last}): {out[size]:8.1f} img/s (best of {ROUNDS})"
        )
    engine.close()
    return out


def binary_request(model_input: str = "input") -> tuple[bytes, dict[str, str]]:
    data = np.random.default_rng(1).standard_normal((1, 3, 224, 224), dtype=np.float32).tobytes()
    header = orjson.dumps({
        "inputs": [{"name": model_input, "shape": [1, 3, 224, 224], "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)}}],
        "parameters": {"binary_data_output": True},
    })  # fmt: skip
    return header + data, {"Inference-Header-Content-Length": str(len(header)),
                           "Content-Type": "application/octet-stream"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--engine-seconds", type=float, default=4)
    parser.add_argument("--sizes", default="1,2,4,8,16,32")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"engine only ({args.model}):")
    engine = engine_throughput(args.model, sizes, args.engine_seconds)
    contiguous = engine_throughput(args.model, sizes, args.engine_seconds, channels_last=False)
    reference = (
        engine.get(args.max_batch)
        or engine_throughput(args.model, [args.max_batch], args.engine_seconds)[args.max_batch]
    )
    body, headers = binary_request()
    served: dict[str, dict] = {}
    for batcher in ("static", "dynamic", "continuous"):
        env = {"WATTSERVE_MODEL": args.model, "WATTSERVE_BATCHER": batcher,
               "WATTSERVE_MAX_BATCH_SIZE": str(args.max_batch), "WATTSERVE_MAX_QUEUE_DELAY_MS": "5",
               "WATTSERVE_MAX_QUEUE_SIZE": "1024"}  # fmt: skip
        with wattserve(env) as url:
            target = f"{url}/v2/models/{args.model}/infer"
            # saturation: twice the max batch in flight so a full batch is always queued
            wrk(target, body, 2 * args.max_batch, 3, headers)
            rounds = [
                wrk(target, body, 2 * args.max_batch, args.seconds / ROUNDS, headers) for _ in range(ROUNDS)
            ]
            result = max(rounds, key=lambda r: r["rps"])
        result["fraction_of_engine"] = result["rps"] / reference
        served[batcher] = result
        print(
            f"  served {batcher:<10}: {result['rps']:8.1f} req/s = {result['fraction_of_engine']:.2f} x engine"
        )
    print()
    print(f"| batch | engine img/s ({args.model}, channels_last) | contiguous (NCHW) | channels_last gain |")
    print("| ---: | ---: | ---: | ---: |")
    for size, ips in engine.items():
        print(f"| {size} | {ips:.1f} | {contiguous[size]:.1f} | {ips / contiguous[size]:.2f}x |")
    print()
    print(
        f"| batcher (max batch {args.max_batch}) | served req/s | / engine at batch {args.max_batch} | p50 ms | p99 ms |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, r in served.items():
        print(
            f"| {name} | {r['rps']:.1f} | {r['fraction_of_engine']:.2f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} |"
        )
    path = save(f"model_batching_{args.model}", {"model": args.model, "engine_img_per_s": engine, "engine_nchw_img_per_s": contiguous,
                "max_batch": args.max_batch, "served": served, "machine": platform.platform()})  # fmt: skip
    print(f"saved {path}")


if __name__ == "__main__":
    main()

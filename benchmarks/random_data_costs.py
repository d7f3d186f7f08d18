"""Where perf_analyzer's random data costs time, part by part, in one run (issue 46).

perf_analyzer's default data is random bytes as FP32: about 1 in 256 values NaN/Inf, 1 in 256
subnormal, the rest spread over every exponent; its JSON mode writes the non-finite ones as
NaN/Infinity tokens. Two candidate costs, each measured beside ordinary inputs:

1. decode: a JSON body of mobilenet_v2's input (150,528 values, ~3.3 MB) through
   ``server.http.codec``'s parser (orjson; python-rapidjson when tokens make orjson refuse), beside
   orjson on the same body with the tokens replaced by ordinary numbers and beside Python's
   json (the fallback before). Also the event loop's longest stall while the body is parsed
   on a worker thread, as the server does past 256 KB: a parser that holds the GIL stalls
   the loop (and the engine thread) for as long as it runs.
2. compute: one torch multiply over normal vs subnormal values (the assist alone), and
   mobilenet_v2 on torch CPU and ONNX Runtime, batches of 1 and 8, ordinary images
   vs random bits vs every element subnormal, with subnormals computed (IEEE) or flushed
   (``WATTSERVE_FLUSH_DENORMAL``), each on an engine thread as the server runs it.

Prints tables and saves results/random_data_costs.json. Medians of ``--repeats`` timings.

    python -m benchmarks.random_data_costs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from benchmarks._harness import save

SHAPE = (3, 224, 224)


def random_bits(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """What perf_analyzer sends by default: uniformly random 32-bit patterns read as FP32."""
    n = int(np.prod(shape))
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32).view(np.float32).reshape(shape)


def body(values: np.ndarray) -> bytes:
    doc = {"inputs": [{"name": "input", "shape": [1, *SHAPE], "datatype": "FP32",
                       "data": [float(v) for v in values.ravel()]}]}  # fmt: skip
    return json.dumps(doc).encode()  # NaN, Infinity, -Infinity as perf_analyzer writes them


def interleaved_ms(cases: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median ms of each case, the cases timed in turn round after round, so a load on this
    shared machine that comes and goes falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        fn()  # warm
    for _ in range(repeats):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


async def loop_stall_ms(parse: Callable[[], Any], repeats: int) -> float:
    """The event loop's longest gap between 1 ms ticks while ``parse`` runs on a thread
    (median over ``repeats`` parses)."""
    stalls = []
    for _ in range(repeats):
        done = asyncio.create_task(asyncio.to_thread(parse))
        worst, last = 0.0, time.perf_counter()
        while not done.done():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst, last = max(worst, now - last), now
        await done
        stalls.append(worst)
    return 1e3 * float(np.median(stalls))


def decode_costs(repeats: int) -> dict[str, Any]:
    import json as stdlib_json

    from wattserve.server.http.codec import _loads

    tokens = body(random_bits(SHAPE))
    plain = tokens.replace(b"NaN", b"0.0").replace(b"Infinity", b"0.0")  # same body, ordinary numbers
    cases = {
        "orjson, ordinary numbers": lambda: orjson.loads(plain),
        "codec, ordinary numbers": lambda: _loads(plain),
        "codec, NaN/Infinity tokens": lambda: _loads(tokens),
        "stdlib json, NaN/Infinity tokens (before)": lambda: stdlib_json.loads(tokens),
    }
    decode = interleaved_ms(cases, repeats)
    out: dict[str, Any] = {}
    for name, fn in cases.items():
        out[name] = {"decode_ms": decode[name], "loop_stall_ms": asyncio.run(loop_stall_ms(fn, 5))}
    out["_body"] = {
        "bytes": len(tokens),
        "nan_tokens": tokens.count(b"NaN"),
        "inf_tokens": tokens.count(b"Infinity"),
    }
    return out


def multiply_costs(repeats: int) -> dict[str, dict[str, float]]:
    """One torch multiply over 4M FP32 values, normal vs subnormal, IEEE vs flushed: the
    microcode assist on its own, without a network around it."""
    import torch
    from wattserve.batchers.executor import engine_thread

    normal = torch.from_numpy(np.random.default_rng(0).uniform(1.0, 2.0, 1 << 22).astype(np.float32))
    subnormal = normal * float(np.finfo(np.float32).tiny) / 4
    out = {}
    for flush in (False, True):
        thread = engine_thread(0, flush_denormal=flush)
        try:
            calls = {"normal": lambda: normal * 1.5, "subnormal": lambda: subnormal * 1.5}
            out["flushed" if flush else "IEEE"] = thread.submit(interleaved_ms, calls, repeats).result()
        finally:
            thread.shutdown(wait=True)
    return out


def compute_costs(repeats: int, batches: list[int]) -> dict[str, dict[str, float]]:
    from wattserve.batchers.executor import engine_thread
    from wattserve.engines.config import EngineConfig
    from wattserve.engines.onnx_export import ensure_onnx
    from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine
    from wattserve.engines.torch_engine import TorchVisionEngine

    tiny = np.finfo(np.float32).tiny
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = ensure_onnx(EngineConfig(model="mobilenet_v2", engine="onnxruntime", cache_dir=Path(tmp)))
        builders = {
            "torch": lambda flush: TorchVisionEngine(
                "mobilenet_v2", device="cpu", max_batch_size=max(batches)
            ),
            "onnxruntime": lambda flush: OnnxRuntimeEngine(
                onnx_path,
                name="mobilenet_v2",
                device="cpu",
                max_batch_size=max(batches),
                flush_denormal=flush,
            ),
        }
        out: dict[str, dict[str, float]] = {}
        for engine_name, build in builders.items():
            for flush in (False, True):
                thread = engine_thread(0, flush_denormal=flush)
                try:
                    engine = thread.submit(build, flush).result()
                    for n in batches:
                        rng = np.random.default_rng(n)
                        ordinary = rng.standard_normal((n, *SHAPE), dtype=np.float32)
                        inputs = {"ordinary": ordinary, "random bits": random_bits((n, *SHAPE), seed=n),
                                  "all subnormal": (ordinary * np.float32(0.5 * tiny)).astype(np.float32)}  # fmt: skip
                        key = f"{engine_name} batch {n} {'flushed' if flush else 'IEEE'}"
                        calls = {
                            name: lambda x=x, e=engine: e.infer({"input": x}) for name, x in inputs.items()
                        }
                        out[key] = thread.submit(interleaved_ms, calls, repeats).result()
                        print(
                            f"  {key:<30} " + "  ".join(f"{k} {v:7.1f} ms" for k, v in out[key].items()),
                            flush=True,
                        )
                    engine.close()
                finally:
                    thread.shutdown(wait=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--skip-compute", action="store_true", help="decode only (seconds)")
    args = p.parse_args(argv)
    print("decode of one mobilenet_v2 JSON body (median ms; loop stall: longest event-loop gap)")
    decode = decode_costs(args.repeats)
    base = decode["orjson, ordinary numbers"]["decode_ms"]
    for name, r in decode.items():
        if not name.startswith("_"):
            print(f"  {name:<44} {r['decode_ms']:7.1f} ms ({r['decode_ms'] / base:4.2f}x orjson)  "
                  f"loop stall {r['loop_stall_ms']:6.1f} ms")  # fmt: skip
    doc: dict[str, Any] = {"decode": decode}
    if not args.skip_compute:
        print("torch multiply over 4M FP32 values (median ms, on an engine thread)")
        doc["multiply"] = multiply_costs(args.repeats)
        for mode, r in doc["multiply"].items():
            print(f"  {mode:<8} normal {r['normal']:6.2f} ms  subnormal {r['subnormal']:6.2f} ms")
        print("compute (median ms per batch, on an engine thread)")
        doc["compute"] = compute_costs(args.repeats, args.batches)
    print(f"saved {save('random_data_costs', doc)}")


if __name__ == "__main__":
    main()

"""The image-classification example as an ensemble (Python preprocess -> ONNX classifier ->
Python postprocess) against the same pipeline in one Python model, on one server, under the
load generator (closed loop at fixed concurrencies, then an open-loop Poisson rate).

    python -m benchmarks.ensemble_pipeline [--concurrencies 1,8] [--rate 40] [--duration 10]

Each request carries one PNG (96x96, 16 distinct ones) as a BYTES element in the binary
tensor extension; the answer is the top-3 labels. Prints a table and saves
results/ensemble_pipeline.json. The load generator has no BYTES payloads of its own, so the
bodies are built here and handed to its runner.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import runpy
import struct
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from wattserve.loadgen import client
from wattserve.loadgen.payloads import PreparedRequest
from wattserve.loadgen.runner import LoadSpec, Target, run_load

from benchmarks._harness import ROOT, save, wattserve

EXAMPLE = ROOT / "examples" / "image_classification"
MODELS = ("image_classifier", "image_classifier_python")


def png_images(count: int, seed: int = 0) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def image_request(model: str, image: bytes) -> PreparedRequest:
    """One BYTES element in the binary extension: a 4-byte little-endian length, then the bytes."""
    raw = struct.pack("<I", len(image)) + image
    header = orjson.dumps({
        "inputs": [{"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "LABELS"}],
    })  # fmt: skip
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return PreparedRequest(f"/v2/models/{model}/infer", header + raw, headers)


async def measure(url: str, specs: list[LoadSpec], images: list[bytes]) -> list[dict[str, Any]]:
    rows = []
    async with aiohttp.ClientSession() as session:
        for model in MODELS:
            metadata = await client.get_json(session, f"{url}/v2/models/{model}")
            target = Target(url, model, "binary", [image_request(model, i) for i in images], None, metadata)
            for spec in specs:
                result = await run_load(session, target, spec)
                s = result.summary
                lat = s.get("latency_ms", {})
                rows.append({"model": model, "load": spec.label, "throughput_rps": s.get("achieved_rate"),
                             "p50_ms": lat.get("p50"), "p99_ms": lat.get("p99"), "errors": s.get("failed"),
                             "summary": s})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrencies", default="1,8")
    parser.add_argument("--rate", type=float, default=0.0, help="also an open-loop Poisson run (0: none)")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args()
    specs = [LoadSpec(arrival="closed", concurrency=int(c), duration_s=args.duration, warmup_s=args.warmup,
                      label=f"closed c={c}") for c in args.concurrencies.split(",")]  # fmt: skip
    if args.rate:
        specs.append(LoadSpec(arrival="poisson", rate=args.rate, duration_s=args.duration,
                              warmup_s=args.warmup, cooldown_s=10, label=f"poisson {args.rate:g}/s"))  # fmt: skip
    build = runpy.run_path(str(EXAMPLE / "build_repository.py"))["build"]
    with tempfile.TemporaryDirectory() as tmp:
        repo = build(Path(tmp) / "repo")
        env = {
            "WATTSERVE_MODEL_REPOSITORY": str(repo),
            "WATTSERVE_TELEMETRY": "false",
            "WATTSERVE_WARMUP": "false",
        }
        with wattserve(env) as url:
            rows = asyncio.run(measure(url, specs, png_images(16)))
    print(f"{'model':<26} {'load':<16} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for r in rows:
        print(f"{r['model']:<26} {r['load']:<16} {r['throughput_rps'] or 0:>8.1f} {r['p50_ms'] or 0:>8.2f} "
              f"{r['p99_ms'] or 0:>8.2f} {r['errors'] or 0:>7}")  # fmt: skip
    save("ensemble_pipeline", {"rows": rows})


if __name__ == "__main__":
    main()

"""Several models in one server: does one model's saturation delay another's requests, and
what does serving a repository cost the hot path? Both measured in one run.

1. Isolation: one server with a repository {identity, resnet50 (torch, 1 thread)}. identity
   latency (wrk, closed loop, 2 connections) alone, then while a second wrk keeps resnet50
   saturated (8 connections, binary 1x3x224x224 requests). Each model has its own batcher,
   queue and engine threads; what is left is CPU sharing itself (on a 2-core machine, a
   lot of it) and the one event loop.
2. Overhead: identity served zero-config (`WATTSERVE_MODEL=identity`) vs the same identity
   alone in a repository vs in a 3-model repository (identity + an ONNX and a TorchScript
   classifier, idle: torch and ONNX Runtime loaded in the process), 16 connections,
   the order reversed every other round (on a shared machine, going first in a round was
   worth ~20% by itself).

    python -m benchmarks.model_isolation [--seconds 8] [--rounds 2]

Prints a table and writes results/model_isolation.json. Needs wrk.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import threading
from pathlib import Path

import numpy as np
import orjson

from benchmarks._harness import save, wattserve, wrk
from support.model_repository import make_repository

IDENTITY_BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                          "data": [float(i) for i in range(16)]}]})  # fmt: skip

IDENTITY = """backend: "wattserve"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 0 }
parameters { key: "builtin" value: { string_value: "identity" } }
"""
RESNET = """backend: "wattserve"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
parameters { key: "builtin" value: { string_value: "resnet50" } }
parameters { key: "torch_threads" value: { string_value: "1" } }
"""


def resnet_request() -> tuple[bytes, dict[str, str]]:
    blob = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32).tobytes()
    header = orjson.dumps({"inputs": [{"name": "input", "shape": [1, 3, 224, 224], "datatype": "FP32",
                                       "parameters": {"binary_data_size": len(blob)}}]})  # fmt: skip
    return header + blob, {"Inference-Header-Content-Length": str(len(header)),
                           "Content-Type": "application/octet-stream"}  # fmt: skip


def write_model(root: Path, name: str, config: str) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(config)


def isolation(root: Path, seconds: float, rounds: int) -> dict:
    repo = root / "isolation"
    write_model(repo, "identity", IDENTITY)
    write_model(repo, "resnet50", RESNET)
    body, headers = resnet_request()
    alone, loaded, resnet = [], [], []
    with wattserve({"WATTSERVE_MODEL_REPOSITORY": str(repo)}) as url:
        ident_url, resnet_url = url + "/v2/models/identity/infer", url + "/v2/models/resnet50/infer"
        wrk(ident_url, IDENTITY_BODY, 2, 2)  # warm-up
        for _ in range(rounds):
            alone.append(wrk(ident_url, IDENTITY_BODY, 2, seconds))
            box: list[dict] = []

            def load_resnet(out: list[dict] = box) -> None:
                out.append(wrk(resnet_url, body, 8, seconds + 4, headers))

            saturate = threading.Thread(target=load_resnet, daemon=True)
            saturate.start()
            threading.Event().wait(2)  # let resnet50's queue fill first
            loaded.append(wrk(ident_url, IDENTITY_BODY, 2, seconds))
            saturate.join()
            resnet.append(box[0])
    return {"identity_alone": alone, "identity_with_resnet50_saturated": loaded, "resnet50": resnet}


def overhead(root: Path, seconds: float, rounds: int) -> dict:
    repo = make_repository(root / "three", broken=False)
    (repo / "identity" / "config.pbtxt").write_text(IDENTITY)
    write_model(root / "one", "identity", IDENTITY)
    one = {"WATTSERVE_MODEL": "identity", "WATTSERVE_BATCHER": "dynamic", "WATTSERVE_MAX_BATCH_SIZE": "16",
           "WATTSERVE_MAX_QUEUE_DELAY_MS": "0"}  # fmt: skip
    variants = {  # zero-config; the same identity alone in a repository; beside two torch/ORT models
        "one_model": one,
        "one_model_repository": {"WATTSERVE_MODEL_REPOSITORY": str(root / "one")},
        "three_model_repository": {"WATTSERVE_MODEL_REPOSITORY": str(repo), "WATTSERVE_TORCH_THREADS": "1"},
    }
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for r in range(rounds):
        order = list(variants.items())
        for name, env in order if r % 2 == 0 else order[::-1]:  # position in a round matters here
            with wattserve(env) as url:
                wrk(url + "/v2/models/identity/infer", IDENTITY_BODY, 16, 2)
                runs[name].append(wrk(url + "/v2/models/identity/infer", IDENTITY_BODY, 16, seconds))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        iso = isolation(Path(tmp), args.seconds, args.rounds)
        ovh = overhead(Path(tmp), args.seconds, args.rounds)

    def mean(runs: list[dict], key: str) -> float:
        return statistics.mean(r[key] for r in runs)

    print(f"{'identity latency':<36} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
    for name in ("identity_alone", "identity_with_resnet50_saturated"):
        r = iso[name]
        print(f"{name:<36} {mean(r, 'p50_ms'):>8.2f} {mean(r, 'p99_ms'):>8.2f} {mean(r, 'rps'):>8.0f}")
    print(f"{'resnet50 (saturating, 8 conns)':<36} {mean(iso['resnet50'], 'p50_ms'):>8.1f} "
          f"{mean(iso['resnet50'], 'p99_ms'):>8.1f} {mean(iso['resnet50'], 'rps'):>8.1f}")  # fmt: skip
    rps = {k: mean(v, "rps") for k, v in ovh.items()}
    print(f"\n{'identity, 16 connections':<36} {'req/s':>8}  per round")
    for name, rounds in ovh.items():
        per = ", ".join(f"{r['rps']:.0f} (p99 {r['p99_ms']:.2f} ms)" for r in rounds)
        print(f"{name:<36} {rps[name]:>8.0f}  {per}")
    ratio = rps["three_model_repository"] / rps["one_model"]
    print(f"three-model repository / one model = {ratio:.2f}; "
          f"one-model repository / one model = {rps['one_model_repository'] / rps['one_model']:.2f}")  # fmt: skip
    errors = sum(r["non_2xx"] for v in (*iso.values(), *ovh.values()) for r in v)
    path = save("model_isolation", {"isolation": iso, "overhead": ovh, "overhead_ratio": ratio,
                                    "non_2xx": errors, "seconds": args.seconds, "rounds": args.rounds,
                                    "machine": platform.platform()})  # fmt: skip
    print(f"non-2xx answers: {errors}\nsaved {path}")


if __name__ == "__main__":
    main()

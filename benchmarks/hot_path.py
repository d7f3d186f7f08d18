"""The hot path, as issue 11 measures it: does the engine idle while work waits, and does
served compute equal engine compute? Optionally against another checkout, same run.

    python -m benchmarks.hot_path [--before PATH] [--seconds 10] [--rounds 2] [--skip-mobilenet]

- P2': identity with 10 ms per batch, max batch 8, one instance, dynamic batcher, closed
  loop (wrk, 64 connections): served req/s / 800 (the engine's ceiling).
- batch-1: mobilenet_v2 one request at a time, X-Compute-Time-Ms p50 / the bare engine's
  batch-1 p50 measured in this process (same settings, server idle meanwhile).
- P2: mobilenet_v2 served img/s at saturation (max batch 8, binary tensors, 16
  connections) / the bare engine's img/s at batch 8.

With ``--before PATH`` (a checkout of an older commit) every served figure is measured for
both checkouts, alternating, so the ratio between them is a same-run comparison. Prints a
table and writes results/hot_path.json. Needs wrk.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from benchmarks._harness import ROOT, save, wattserve, wrk
from benchmarks.model_batching import binary_request

IDENTITY_BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                          "data": [float(i) for i in range(16)]}]})  # fmt: skip


def metric_sum(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([\d.e+-]+)$", text, re.M))


def p2_prime(root: Path, seconds: float) -> dict:
    env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_IDENTITY_DELAY_MS": "10", "WATTSERVE_BATCHER": "dynamic",
           "WATTSERVE_MAX_BATCH_SIZE": "8", "WATTSERVE_INSTANCES": "1", "WATTSERVE_MAX_QUEUE_SIZE": "1024"}  # fmt: skip
    with wattserve(env, root=root) as url:
        target = url + "/v2/models/identity/infer"
        wrk(target, IDENTITY_BODY, 64, 2)  # warm-up
        before = httpx.get(url + "/metrics").text
        run = wrk(target, IDENTITY_BODY, 64, seconds)
        after = httpx.get(url + "/metrics").text
    batches = metric_sum(after, "wattserve_batch_executions_total") - metric_sum(
        before, "wattserve_batch_executions_total"
    )
    items = metric_sum(after, "wattserve_inferences_total") - metric_sum(before, "wattserve_inferences_total")
    return {**run, "ratio_to_800": run["rps"] / 800.0, "mean_batch": items / batches if batches else None}


def engine_only(seconds: float, fuse_conv_bn: bool = True) -> dict:
    """The bare engine in this process, with the server's own settings and allocator.
    ``fuse_conv_bn=False``: the engine as a checkout from before BatchNorm folding builds it."""
    from wattserve.engines.registry import build_engine
    from wattserve.server.lifecycle import tune_malloc
    from wattserve.server.settings import Settings

    tune_malloc()
    engine = build_engine(Settings(model="mobilenet_v2", fuse_conv_bn=fuse_conv_bn))
    rng = np.random.default_rng(0)
    one = {"input": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)}
    eight = {"input": rng.standard_normal((8, 3, 224, 224), dtype=np.float32)}
    for batch in (one, eight, one):
        engine.infer(batch)
    times = []
    t_end = time.perf_counter() + seconds / 2
    while time.perf_counter() < t_end or len(times) < 10:
        t0 = time.perf_counter()
        engine.infer(one)
        times.append(time.perf_counter() - t0)
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds / 2 or calls < 3:
        engine.infer(eight)
        calls += 1
    rate8 = calls * 8 / (time.perf_counter() - t0)
    close = getattr(engine, "close", None)
    if close is not None:
        close()
    return {"batch1_p50_ms": statistics.median(times) * 1e3, "batch8_img_s": rate8}


def mobilenet_served(root: Path, seconds: float, extra_env: dict[str, str] | None = None) -> dict:
    env = {"WATTSERVE_MODEL": "mobilenet_v2", "WATTSERVE_BATCHER": "dynamic", "WATTSERVE_MAX_BATCH_SIZE": "8",
           "WATTSERVE_MAX_QUEUE_SIZE": "1024", **(extra_env or {})}  # fmt: skip
    body, headers = binary_request()
    with wattserve(env, root=root) as url:
        target = url + "/v2/models/mobilenet_v2/infer"
        computes = []
        with httpx.Client(timeout=60) as client:
            for _ in range(5):
                client.post(target, content=body, headers=headers)
            t_end = time.perf_counter() + seconds / 2
            while time.perf_counter() < t_end or len(computes) < 10:
                r = client.post(target, content=body, headers=headers)
                computes.append(float(r.headers["x-compute-time-ms"]))
        wrk(target, body, 16, 2, headers)  # warm-up at load
        run = wrk(target, body, 16, seconds, headers)
    return {"batch1_compute_p50_ms": statistics.median(computes), "saturated_img_s": run["rps"], **run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", type=Path, default=None, help="an older checkout to compare with")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-mobilenet", action="store_true")
    parser.add_argument(
        "--before-folds", action="store_true",
        help="the --before checkout folds BatchNorm too (any checkout from 0e4f399 on): compare its "
        "served figures with the folded engine",
    )  # fmt: skip
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
        help="also serve mobilenet_v2 from this checkout with these env vars (same-run A/B), "
        "e.g. threads1:WATTSERVE_TORCH_THREADS=1 or passive:OMP_WAIT_POLICY=PASSIVE",
    )  # fmt: skip
    args = parser.parse_args()
    roots = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    variants = {
        v.split(":", 1)[0]: dict(kv.split("=", 1) for kv in v.split(":", 1)[1].split(","))
        for v in args.variant
    }
    results: dict[str, dict[str, list[dict]]] = {label: {"p2_prime": [], "mobilenet": []} for label in roots}
    by_variant: dict[str, list[dict]] = {name: [] for name in variants}
    engine: list[dict] = []
    engine_unfolded: list[dict] = []
    for _ in range(args.rounds):
        for label, root in roots.items():  # alternating: the machine's drift hits both alike
            results[label]["p2_prime"].append(p2_prime(root, args.seconds))
            if not args.skip_mobilenet:
                results[label]["mobilenet"].append(mobilenet_served(root, args.seconds))
        for name, env in variants.items():
            by_variant[name].append(mobilenet_served(ROOT, args.seconds, env))
        if not args.skip_mobilenet:
            engine.append(engine_only(args.seconds))
            engine_unfolded.append(engine_only(args.seconds, fuse_conv_bn=False))

    def mean(rows: list[dict], key: str) -> float:
        return statistics.mean(r[key] for r in rows)

    print(f"\n{'figure':<44}" + "".join(f"{label:>14}" for label in roots))
    line = {"P2' served req/s (identity 10 ms/batch, max 8)": ("p2_prime", "rps"),
            "P2' served / 800": ("p2_prime", "ratio_to_800"),
            "P2' mean batch size": ("p2_prime", "mean_batch")}  # fmt: skip
    if not args.skip_mobilenet:
        line |= {"mobilenet batch-1 served compute p50 ms": ("mobilenet", "batch1_compute_p50_ms"),
                 "mobilenet saturated img/s (max 8)": ("mobilenet", "saturated_img_s"),
                 "mobilenet saturated p99 ms": ("mobilenet", "p99_ms")}  # fmt: skip
    summary: dict[str, dict[str, float]] = {}
    for name, (group, key) in line.items():
        summary[name] = {label: mean(results[label][group], key) for label in roots}
        print(f"{name:<44}" + "".join(f"{summary[name][label]:>14.3f}" for label in roots))
    if engine:
        e1 = statistics.mean(e["batch1_p50_ms"] for e in engine)
        e8 = statistics.mean(e["batch8_img_s"] for e in engine)
        u1 = statistics.mean(e["batch1_p50_ms"] for e in engine_unfolded)
        u8 = statistics.mean(e["batch8_img_s"] for e in engine_unfolded)
        print(f"\nengine only, this process: batch-1 p50 {e1:.2f} ms, batch 8 {e8:.1f} img/s")
        print(f"engine only, BatchNorm not folded: batch-1 p50 {u1:.2f} ms, batch 8 {u8:.1f} img/s")
        summary["engine only"] = {"batch1_p50_ms": e1, "batch8_img_s": e8}
        summary["engine only, not folded"] = {"batch1_p50_ms": u1, "batch8_img_s": u8}
        for label in roots:
            # a checkout from before the folding serves the unfolded model: compare like with like
            ref1, ref8 = (u1, u8) if label == "before" and not args.before_folds else (e1, e8)
            b1 = summary["mobilenet batch-1 served compute p50 ms"][label] / ref1
            p2 = summary["mobilenet saturated img/s (max 8)"][label] / ref8
            summary[f"batch-1 served/engine ({label})"] = {label: b1}
            summary[f"P2 served/engine at batch 8 ({label})"] = {label: p2}
            print(
                f"{label:>6}: batch-1 served compute / engine = {b1:.2f}; P2 served / engine img/s = {p2:.2f}"
            )
    for name, rows in by_variant.items():
        b1 = mean(rows, "batch1_compute_p50_ms")
        sat = mean(rows, "saturated_img_s")
        print(f"variant {name} {variants[name]}: batch-1 compute p50 {b1:.2f} ms, saturated {sat:.1f} img/s, "
              f"p99 {mean(rows, 'p99_ms'):.0f} ms")  # fmt: skip
        summary[f"variant {name}"] = {"batch1_compute_p50_ms": b1, "saturated_img_s": sat}
    doc = {"machine": platform.platform(), "args": {k: str(v) for k, v in vars(args).items()},
           "runs": results, "variants": by_variant, "engine_only": engine,
           "engine_only_not_folded": engine_unfolded, "summary": summary}  # fmt: skip
    print(f"\nwrote {save('hot_path', doc)}")


if __name__ == "__main__":
    main()

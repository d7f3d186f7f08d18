"""The hot path, as issue 11 measures it: does the engine idle while work waits, and does
served compute equal engine compute? Optionally against another checkout, same run.

    python -m benchmarks.hot_path [--before PATH] [--seconds 10] [--rounds 2] [--skip-mobilenet]
                                  [--classify-first]

- P2': identity with 10 ms per batch, max batch 8, one instance, dynamic batcher, closed
  loop (wrk, 64 connections): served req/s / 800 (the engine's ceiling).
- batch-1: mobilenet_v2 one request at a time, X-Compute-Time-Ms p50 / the bare engine's
  batch-1 p50 in this process (same settings, server idle meanwhile), in blocks of 15 that
  alternate served and bare, so both see the machine in the same state; the figure is the
  median of the blocks' ratios. Also the server's context switches per request (all threads).
- P2: mobilenet_v2 served img/s at saturation (max batch 8, binary tensors, 16
  connections) / the bare engine's img/s at batch 8, measured right after each served run.
- ``--classify-first``: each mobilenet_v2 server gets one image upload first, so its
  preprocessing has run before the figures are taken (it must not slow the engine after).

With ``--before PATH`` (a checkout of an older commit) every served figure is measured for
both checkouts, alternating, so the ratio between them is a same-run comparison. Prints a
table and writes results/hot_path.json. Needs wrk.
"""

from __future__ import annotations

import argparse
import io
import platform
import re
import statistics
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from benchmarks._harness import ROOT, parse_variant, save, wattserve, wattserve_process, wrk
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


class ReferenceEngine:
    """The bare engine in this process, with the server's own settings and allocator: the
    reference every served figure is divided by, measured right after it (same minute).
    ``fuse_conv_bn=False``: the engine as a checkout from before BatchNorm folding builds it."""

    def __init__(self, fuse_conv_bn: bool = True) -> None:
        from wattserve.engines.registry import build_engine
        from wattserve.server.lifecycle import tune_malloc
        from wattserve.server.settings import Settings

        tune_malloc()
        self.engine = build_engine(Settings(model="mobilenet_v2", fuse_conv_bn=fuse_conv_bn).engine_config())
        rng = np.random.default_rng(0)
        self.one = {"input": rng.standard_normal((1, 3, 224, 224), dtype=np.float32)}
        self.eight = {"input": rng.standard_normal((8, 3, 224, 224), dtype=np.float32)}
        for batch in (self.one, self.eight, self.one):
            self.engine.infer(batch)

    def batch1_ms(self, calls: int) -> list[float]:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            self.engine.infer(self.one)
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    def batch8_img_s(self, seconds: float) -> float:
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or calls < 3:
            self.engine.infer(self.eight)
            calls += 1
        return calls * 8 / (time.perf_counter() - t0)


def context_switches(pid: int) -> int:
    """Context switches (voluntary and not) of every live thread of ``pid`` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        total += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)
    return total


def png_image() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def mobilenet_served(
    root: Path,
    seconds: float,
    reference: ReferenceEngine,
    extra_env: dict[str, str] | None = None,
    blocks: int = 6,
    classify_first: bool = False,
) -> dict:
    """Batch 1 in blocks alternating with the bare engine (paired medians), then saturation
    followed at once by the bare engine at batch 8. ``classify_first``: one image upload to
    the classify route before any of it (its preprocessing runs torch ops too)."""
    env = {"WATTSERVE_MODEL": "mobilenet_v2", "WATTSERVE_BATCHER": "dynamic", "WATTSERVE_MAX_BATCH_SIZE": "8",
           "WATTSERVE_MAX_QUEUE_SIZE": "1024", **(extra_env or {})}  # fmt: skip
    body, headers = binary_request()
    per_block = 15
    with wattserve_process(env, root=root) as proc:
        target = proc.url + "/v2/models/mobilenet_v2/infer"
        served: list[float] = []
        alone: list[float] = []
        switches = 0
        with httpx.Client(timeout=60) as client:
            if classify_first:
                answer = client.post(proc.url + "/v2/models/mobilenet_v2/classify", content=png_image(),
                                     headers={"content-type": "image/png"})  # fmt: skip
                answer.raise_for_status()
            for _ in range(5):
                client.post(target, content=body, headers=headers)
            for _ in range(blocks):
                before = context_switches(proc.pid)
                block = [client.post(target, content=body, headers=headers) for _ in range(per_block)]
                switches += context_switches(proc.pid) - before
                served.append(statistics.median(float(r.headers["x-compute-time-ms"]) for r in block))
                alone.append(statistics.median(reference.batch1_ms(per_block)))
        wrk(target, body, 16, 2, headers)  # warm-up at load
        run = wrk(target, body, 16, seconds, headers)
    engine8 = reference.batch8_img_s(seconds / 2)
    return {
        **run,
        "batch1_compute_p50_ms": statistics.median(served),
        "batch1_engine_p50_ms": statistics.median(alone),
        "batch1_ratio": statistics.median(s / a for s, a in zip(served, alone, strict=True)),
        "batch1_context_switches_per_request": switches / (blocks * per_block),
        "saturated_img_s": run["rps"],
        "engine_batch8_img_s": engine8,
        "p2": run["rps"] / engine8,
    }


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
        "--variant", action="append", default=[], type=parse_variant, metavar="NAME:VAR=VALUE[,VAR=VALUE]",
        help="also serve mobilenet_v2 from this checkout with these env vars (same-run A/B), "
        "e.g. threads1:WATTSERVE_TORCH_THREADS=1 or passive:OMP_WAIT_POLICY=PASSIVE",
    )  # fmt: skip
    parser.add_argument(
        "--classify-first", action="store_true",
        help="upload one image to the classify route before the mobilenet_v2 figures",
    )  # fmt: skip
    args = parser.parse_args()
    roots = {"after": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    variants = dict(args.variant)
    results: dict[str, dict[str, list[dict]]] = {label: {"p2_prime": [], "mobilenet": []} for label in roots}
    by_variant: dict[str, list[dict]] = {name: [] for name in variants}
    references: dict[str, ReferenceEngine] = {}
    if not args.skip_mobilenet:
        references["folded"] = ReferenceEngine()
        if args.before and not args.before_folds:
            references["not folded"] = ReferenceEngine(fuse_conv_bn=False)

    def reference_for(label: str) -> ReferenceEngine:
        # a checkout from before the folding serves the unfolded model: compare like with like
        return references["not folded" if label == "before" and not args.before_folds else "folded"]

    for _ in range(args.rounds):
        for label, root in roots.items():  # alternating: the machine's drift hits both alike
            results[label]["p2_prime"].append(p2_prime(root, args.seconds))
            if not args.skip_mobilenet:
                results[label]["mobilenet"].append(
                    mobilenet_served(
                        root, args.seconds, reference_for(label), classify_first=args.classify_first
                    )
                )
        for name, env in variants.items():
            by_variant[name].append(
                mobilenet_served(
                    ROOT, args.seconds, references["folded"], env, classify_first=args.classify_first
                )
            )

    def mean(rows: list[dict], key: str) -> float:
        return statistics.mean(r[key] for r in rows)

    print(f"\n{'figure':<52}" + "".join(f"{label:>14}" for label in roots))
    line = {"P2' served req/s (identity 10 ms/batch, max 8)": ("p2_prime", "rps"),
            "P2' served / 800": ("p2_prime", "ratio_to_800"),
            "P2' mean batch size": ("p2_prime", "mean_batch")}  # fmt: skip
    if not args.skip_mobilenet:
        line |= {"mobilenet batch-1 served compute p50 ms": ("mobilenet", "batch1_compute_p50_ms"),
                 "mobilenet batch-1 bare engine p50 ms (paired)": ("mobilenet", "batch1_engine_p50_ms"),
                 "batch-1 served / engine (paired blocks)": ("mobilenet", "batch1_ratio"),
                 "batch-1 server context switches per request": ("mobilenet", "batch1_context_switches_per_request"),
                 "mobilenet saturated img/s (max 8)": ("mobilenet", "saturated_img_s"),
                 "bare engine batch 8 img/s (right after)": ("mobilenet", "engine_batch8_img_s"),
                 "P2 served / engine img/s (paired)": ("mobilenet", "p2"),
                 "mobilenet saturated p99 ms": ("mobilenet", "p99_ms")}  # fmt: skip
    summary: dict[str, dict[str, float]] = {}
    for name, (group, key) in line.items():
        summary[name] = {label: mean(results[label][group], key) for label in roots}
        print(f"{name:<52}" + "".join(f"{summary[name][label]:>14.3f}" for label in roots))
    if "before" in roots and not args.skip_mobilenet:
        print(
            f"(the before column's bare engine: BatchNorm {'folded' if args.before_folds else 'not folded'})"
        )
    for name, rows in by_variant.items():
        figures = {key: mean(rows, key) for key in ("batch1_compute_p50_ms", "batch1_ratio", "saturated_img_s",
                                                    "p2", "p99_ms")}  # fmt: skip
        print(f"variant {name} {variants[name]}: batch-1 compute p50 {figures['batch1_compute_p50_ms']:.2f} ms "
              f"({figures['batch1_ratio']:.2f}x engine), saturated {figures['saturated_img_s']:.1f} img/s "
              f"(P2 {figures['p2']:.2f}), p99 {figures['p99_ms']:.0f} ms")  # fmt: skip
        summary[f"variant {name}"] = figures
    doc = {"machine": platform.platform(), "args": {k: str(v) for k, v in vars(args).items()},
           "runs": results, "variants": by_variant, "summary": summary}  # fmt: skip
    print(f"\nwrote {save('hot_path', doc)}")


if __name__ == "__main__":
    main()

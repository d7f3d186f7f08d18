"""On a lent GPU: build/capture every engine, check it against torch, time it per batch size.

What it does, per model (default mobilenet_v2 and resnet50):
  1. torch eager on CUDA, fp32 with TF32 off: the reference outputs for every batch size;
  2. torch eager (the served engine, TF32 as torch defaults) and fp16, timed;
  3. CUDA graphs (engines.cuda_graphs), one per batch size, plus an off-bucket size to
     exercise padding; checked against the reference and timed;
  4. ONNX Runtime with CUDAExecutionProvider, if this onnxruntime has it (else says so);
  5. TensorRT, if ``tensorrt`` imports: plans built with the min/opt/max profiles (fp32 and
     fp16), build time, a second load to show the plan cache hit; then, if ``pycuda`` also
     imports, the TensorRTEngine runtime checked and timed per batch size (else says so).

``--engines`` names what to check (default: all four of torch, cuda-graphs,
onnxruntime-cuda, tensorrt). A requested engine whose library is absent is reported as
NOT CHECKED, never as a pass, and makes the exit status non-zero.

Prints a table and writes gpu_engines_check.json to --out-dir (default: $OUT, else
results/gpu). Exit 1 if any engine disagrees with the reference or fails, 2 without CUDA,
3 if a requested engine could not be checked, else 0. Needs torch, torchvision, numpy (and
onnx/onnxruntime/tensorrt/pycuda for those engines) but no server package (no pydantic).
Run it through scripts/gpu_check.sh, which records the environment first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# max|engine - reference| / max|reference| allowed. TF32 and fp16 change low-order bits;
# a wrong binding, profile or slice gives errors of order 1.
TOLERANCE = {"fp32": 2e-2, "fp16": 1e-1}
ENGINES = ("torch", "cuda-graphs", "onnxruntime-cuda", "tensorrt")
EXIT_FAILED, EXIT_NO_CUDA, EXIT_NOT_CHECKED = 1, 2, 3


def parse_engines(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ENGINES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown engines {unknown}; choose from {', '.join(ENGINES)}")
    return names


def unavailable(requested: list[str], env: dict) -> dict[str, str]:
    """Requested engines whose libraries this machine lacks, with the reason (no GPU needed)."""
    missing: dict[str, str] = {}
    if "onnxruntime-cuda" in requested and "CUDAExecutionProvider" not in env.get(
        "onnxruntime_providers", []
    ):
        missing["onnxruntime-cuda"] = f"onnxruntime has no CUDAExecutionProvider ({env.get('onnxruntime')})"
    if "tensorrt" in requested:
        if not str(env.get("tensorrt", "")).split(".")[0].isdigit():
            missing["tensorrt"] = f"tensorrt {env.get('tensorrt')}"
        elif not str(env.get("pycuda", "")).startswith("ok"):
            missing["tensorrt"] = f"pycuda {env.get('pycuda')} (a plan without its runtime is no check)"
    return missing


def exit_code(failures: list[str], not_checked: dict[str, str]) -> int:
    """Failures first; then anything requested but not checked; 0 only when all ran and agreed."""
    if failures:
        return EXIT_FAILED
    if not_checked:
        return EXIT_NOT_CHECKED
    return 0


def log(msg: str) -> None:
    print(msg, flush=True)


def batch_for(size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + size)
    return {"input": rng.standard_normal((size, 3, 224, 224), dtype=np.float32)}


def compare(got: np.ndarray, ref: np.ndarray) -> dict:
    got = got.astype(np.float32)
    return {
        "rel_diff": float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)),
        "top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean()),
    }


def time_calls(fn, min_iters: int, min_seconds: float) -> dict:
    """Wall time per call (numpy in, numpy out: includes copies, like serving)."""
    for _ in range(3):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 10 * min_iters:
            break
    return {"median_ms": statistics.median(times) * 1e3, "p90_ms": float(np.percentile(times, 90)) * 1e3,
            "iters": len(times)}  # fmt: skip


class Report:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.failures: list[str] = []
        self.not_checked: dict[str, str] = {}

    def note(self, msg: str) -> None:
        log(f"NOTE: {msg}")
        self.notes.append(msg)

    def add(self, model: str, engine: str, precision: str, size: int, ref, engine_fn, args) -> None:
        row: dict = {"model": model, "engine": engine, "precision": precision, "batch_size": size}
        try:
            out = engine_fn(batch_for(size))["logits"]
            if out.shape != (size, 1000):
                raise AssertionError(f"output shape {out.shape}")
            if ref is not None:
                row.update(compare(out, ref))
                if row["rel_diff"] > TOLERANCE[precision]:
                    self.failures.append(
                        f"{model} {engine} {precision} batch {size}: rel diff {row['rel_diff']:.2e}"
                    )
            batch = batch_for(size)
            row.update(time_calls(lambda: engine_fn(batch), args.min_iters, args.min_seconds))
            row["images_per_s"] = size / (row["median_ms"] / 1e3)
        except Exception as exc:  # record and go on: one broken engine must not hide the others
            row["error"] = f"{type(exc).__name__}: {exc}"
            self.failures.append(f"{model} {engine} {precision} batch {size}: {row['error']}")
            traceback.print_exc()
        self.rows.append(row)
        shown = (f"{row['median_ms']:8.2f} ms {row['images_per_s']:9.1f} img/s" if "median_ms" in row
                 else row.get("error", ""))  # fmt: skip
        diff = f"rel {row['rel_diff']:.1e} top1 {row['top1_agreement']:.2f}" if "rel_diff" in row else ""
        log(f"  {model:<13} {engine:<22} {precision} batch {size:>3}: {shown}  {diff}")


def check_model(model: str, args, report: Report, env: dict) -> None:
    import torch
    from wattserve.engines.cuda_graphs import CudaGraphEngine
    from wattserve.engines.torch_engine import TorchVisionEngine

    sizes = args.batch_sizes
    log(f"\n== {model}")
    reference = TorchVisionEngine(model, device="cuda", max_batch_size=max(sizes))
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    refs = {b: reference.infer(batch_for(b))["logits"] for b in [*sizes, args.off_bucket]}
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32

    # fp32 rows run with TF32 on (what Hopper serving uses); the reference has it off, so
    # TOLERANCE["fp32"] is a TF32 tolerance (10-bit mantissa through ~50 layers)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    half = TorchVisionEngine(model, device="cuda", fp16=True, max_batch_size=max(sizes))
    if "torch" in args.engines:
        for b in sizes:
            report.add(model, "torch eager", "fp32", b, refs[b], reference.infer, args)
        for b in sizes:
            report.add(model, "torch eager", "fp16", b, refs[b], half.infer, args)

    for precision, base in (("fp32", reference), ("fp16", half)):
        if "cuda-graphs" not in args.engines:
            break
        try:
            t0 = time.perf_counter()
            graphs = CudaGraphEngine(base, sizes)
            seconds = time.perf_counter() - t0
            log(f"  captured CUDA graphs {graphs.batch_sizes} ({precision}) in {seconds:.1f}s")
        except Exception as exc:
            report.failures.append(f"{model} CUDA graph capture {precision}: {exc}")
            traceback.print_exc()
            continue
        for b in [*sizes, args.off_bucket]:
            name = "torch cuda-graphs" + (" (padded)" if b not in sizes else "")
            report.add(model, name, precision, b, refs[b], graphs.infer, args)

    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    if "onnxruntime-cuda" in args.engines and "onnxruntime-cuda" not in report.not_checked:
        check_onnxruntime(model, args, report, env, refs)
    if "tensorrt" in args.engines and "tensorrt" not in report.not_checked:
        check_tensorrt(model, args, report, env, refs)
    del reference, half
    torch.cuda.empty_cache()


def onnx_file(model: str, args) -> Path:
    """The cached ONNX export (plain attributes: no server settings, so no pydantic here)."""
    from types import SimpleNamespace

    from wattserve.engines.onnx_export import ensure_onnx

    return ensure_onnx(SimpleNamespace(model=model, cache_dir=args.cache_dir, onnx_path=None, seed=0,
                                       weights=None))  # fmt: skip


def check_onnxruntime(model: str, args, report: Report, env: dict, refs: dict) -> None:
    if "CUDAExecutionProvider" not in env.get("onnxruntime_providers", []):
        report.note(
            f"onnxruntime here has no CUDAExecutionProvider ({env.get('onnxruntime')}): ORT on GPU not run"
        )
        return
    from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine

    engine = OnnxRuntimeEngine(onnx_file(model, args), name=model, max_batch_size=max(args.batch_sizes),
                               device="cuda:0")  # fmt: skip
    for b in args.batch_sizes:
        report.add(model, "onnxruntime cuda", "fp32", b, refs[b], engine.infer, args)
    engine.close()


def check_tensorrt(model: str, args, report: Report, env: dict, refs: dict) -> None:
    from wattserve.engines.base import EngineUnavailable
    from wattserve.engines.profiles import parse_profiles, select_profile
    from wattserve.engines.tensorrt_engine import (
        TensorRTEngine,
        gpu_identity,
        import_pycuda,
        import_tensorrt,
        load_or_build_plan,
    )

    try:
        trt = import_tensorrt()
        cuda = import_pycuda()
    except EngineUnavailable as exc:
        report.note(f"TensorRT is NOT importable/usable here ({exc}): no TensorRT engine built or run")
        return
    profiles = parse_profiles(args.profiles)
    gpu = gpu_identity(cuda, 0)
    path = onnx_file(model, args)
    for precision in args.precisions:
        fp16 = precision == "fp16"

        def build(fp16: bool = fp16):  # runs on the engine's CUDA thread, cuda:0 current
            return load_or_build_plan(
                path, profiles, model=model, gpu=gpu, fp16=fp16, cache_dir=args.cache_dir
            )

        try:
            engine = TensorRTEngine(None, name=model, expected_profiles=profiles, build=build)
            record = engine.plan
            again = load_or_build_plan(
                path, profiles, model=model, gpu=gpu, fp16=fp16, cache_dir=args.cache_dir
            )
        except Exception as exc:
            report.failures.append(f"{model} TensorRT build {precision}: {exc}")
            traceback.print_exc()
            continue
        how = f"built in {record.build_seconds:.1f}s" if record.built else "cached"
        size_mib = record.path.stat().st_size / 2**20
        log(f"  TensorRT {trt.__version__} plan {precision} {args.profiles}: {how}, {size_mib:.1f} MiB; "
            f"second load cached={not again.built}")  # fmt: skip
        report.rows.append({"model": model, "engine": "tensorrt build", "precision": precision,
                            "build_seconds": record.build_seconds, "built": record.built,
                            "cache_hit_second_time": not again.built, "plan": str(record.path)})  # fmt: skip
        for b in [*args.batch_sizes, args.off_bucket]:
            index, run = select_profile(b, engine.profiles)
            name = f"tensorrt profile {engine.profiles[index]}" + (f" (pad to {run})" if run > b else "")
            report.add(model, name, precision, b, refs[b], engine.infer, args)
        engine.close()


def environment() -> dict:
    env: dict = {"python": sys.version.split()[0]}
    for mod in ("torch", "torchvision", "onnx", "onnxruntime", "tensorrt"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as exc:
            env[mod] = f"not importable: {exc}"
    try:
        import onnxruntime

        env["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except Exception:
        env["onnxruntime_providers"] = []
    try:
        import pycuda.driver as cuda

        cuda.init()
        env["pycuda"] = f"ok, {cuda.Device.count()} device(s)"
    except Exception as exc:
        env["pycuda"] = f"not usable: {exc}"
    return env


def print_table(rows: list[dict]) -> None:
    log("\n| model | engine | precision | batch | median ms | img/s | rel diff | top-1 agree |")
    log("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "batch_size" not in r:
            continue
        if "error" in r:
            log(f"| {r['model']} | {r['engine']} | {r['precision']} | {r['batch_size']} | error | | | |")
            continue
        diff = f"{r['rel_diff']:.1e}" if "rel_diff" in r else ""
        agree = f"{r['top1_agreement']:.2f}" if "top1_agreement" in r else ""
        log(f"| {r['model']} | {r['engine']} | {r['precision']} | {r['batch_size']} | {r['median_ms']:.2f} "
            f"| {r['images_per_s']:.0f} | {diff} | {agree} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2", "resnet50"])
    parser.add_argument("--engines", type=parse_engines, default=list(ENGINES),
                        help=f"comma-separated, from {','.join(ENGINES)} (default: all)")  # fmt: skip
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16, 32]
    )
    parser.add_argument("--preflight", action="store_true",
                        help="only check the engines' libraries are here (no GPU needed)")  # fmt: skip
    parser.add_argument("--off-bucket", type=int, default=3, help="a size that is no bucket (padding path)")
    parser.add_argument("--profiles", default="1:1:1,2:4:8,8:16:32")
    parser.add_argument("--precisions", nargs="+", default=["fp16", "fp32"], choices=["fp16", "fp32"])
    parser.add_argument("--min-iters", type=int, default=20)
    parser.add_argument("--min-seconds", type=float, default=0.5)
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "wattserve")
    parser.add_argument(
        "--out-dir", type=Path, default=Path(os.environ.get("OUT") or ROOT / "results" / "gpu")
    )
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "gpu_engines_check.json"

    env = environment()
    log(json.dumps(env, indent=2))
    report = Report()
    report.not_checked = unavailable(args.engines, env)
    for engine, reason in report.not_checked.items():
        log(f"NOT CHECKED: {engine}: {reason}")
    if args.preflight:
        preflight = {"environment": env, "requested": args.engines, "not_checked": report.not_checked}
        out.with_name("gpu_engines_preflight.json").write_text(json.dumps(preflight, indent=2))
        log(f"preflight: {len(args.engines) - len(report.not_checked)} of {len(args.engines)} requested "
            "engines can be checked here")  # fmt: skip
        return exit_code([], report.not_checked)
    import torch

    if not torch.cuda.is_available():
        msg = "no CUDA device visible to torch: this check needs a GPU; nothing was run"
        log(f"ERROR: {msg}")
        out.write_text(json.dumps({"environment": env, "error": msg, "requested": args.engines,
                                   "not_checked": report.not_checked}, indent=2))  # fmt: skip
        return EXIT_NO_CUDA
    env["gpu"] = torch.cuda.get_device_name(0)
    env["date"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    log(f"GPU: {env['gpu']}")
    for model in args.models:
        try:
            check_model(model, args, report, env)
        except Exception as exc:
            report.failures.append(f"{model}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        out.write_text(json.dumps({"environment": env, "requested": args.engines, "rows": report.rows,
                                   "notes": report.notes, "failures": report.failures,
                                   "not_checked": report.not_checked}, indent=2))  # fmt: skip
    print_table(report.rows)
    for n in report.notes:
        log(f"NOTE: {n}")
    for f in report.failures:
        log(f"FAIL: {f}")
    for engine, reason in report.not_checked.items():
        log(f"NOT CHECKED (requested): {engine}: {reason}")
    log(f"wrote {out}")
    return exit_code(report.failures, report.not_checked)


if __name__ == "__main__":
    raise SystemExit(main())

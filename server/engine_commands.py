"""``wattserve export`` and ``wattserve build-engine``: the command-line side of the engines.

The engine modules (``engines/onnx_export.py``, ``engines/tensorrt_engine.py``) hold the
work: export and check, build and cache a plan. This module only turns flags into those
calls and their results into lines on the terminal, so no engine module parses arguments.
Both engine modules import torch, onnx and TensorRT only when a command runs, so
``wattserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from wattserve.engines import onnx_export
from wattserve.engines import tensorrt_engine as trt_engine
from wattserve.engines.base import EngineUnavailable
from wattserve.engines.config import EngineConfig
from wattserve.engines.profiles import parse_profiles
from wattserve.engines.registry import TORCHVISION_MODELS
from wattserve.server.settings import Settings

# The server's own defaults, so a plan built here is the one `wattserve serve` finds.
DEFAULT_CACHE_DIR: Path = Settings.model_fields["cache_dir"].default
DEFAULT_TRT_PROFILES: str = Settings.model_fields["trt_profiles"].default


def add_engine_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``export`` (torch -> ONNX) and ``build-engine`` (ONNX -> TensorRT plan)."""
    export = sub.add_parser("export", help="export a torchvision model to ONNX (dynamic batch axis), "
                            "optionally as a Triton repository entry")  # fmt: skip
    add_export_arguments(export)
    export.set_defaults(func=run_export)
    build = sub.add_parser("build-engine", help="build a TensorRT plan with min/opt/max batch profiles")
    add_build_engine_arguments(build)
    build.set_defaults(func=run_build_engine)


# --------------------------------------------------------------------------- export


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mobilenet_v2", choices=TORCHVISION_MODELS)
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights")
    parser.add_argument("--weights", default=None, help="local state-dict file (optional)")
    parser.add_argument("--out", type=Path, default=None, help="ONNX file (default: cache)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--legacy", action="store_true", help="TorchScript exporter, opset 17 (deprecated)")
    parser.add_argument(
        "--verify",
        default="1,2,4,8,16,32",
        help="batch sizes to compare with torch (empty: skip)",
    )
    parser.add_argument("--rtol", type=float, default=onnx_export.DEFAULT_RTOL)
    parser.add_argument(
        "--repository",
        type=Path,
        default=None,
        help="write a Triton repository entry <dir>/<model>/{config.pbtxt,1/model.onnx}",
    )
    parser.add_argument("--max-batch-size", type=int, default=8, help="config.pbtxt max_batch_size")
    parser.add_argument("--max-queue-delay-us", type=int, default=1000,
                        help="config.pbtxt dynamic_batching.max_queue_delay_microseconds")  # fmt: skip


def run_export(args: argparse.Namespace) -> int:
    """Export, check, compare with torch (exit 1 if they disagree); with ``--repository``,
    export straight into a repository entry and write its ``config.pbtxt``."""
    if args.repository is None:
        return _export_onnx(args, args.out)
    from wattserve.server.models.repository.config import CONFIG_FILE, to_text
    from wattserve.server.models.repository.export import entry_config, write_entry

    out = Path(args.repository) / args.model / "1" / "model.onnx"
    status = _export_onnx(args, out)
    if status != 0:
        return status
    config = entry_config(args.model, args.max_batch_size, args.max_queue_delay_us)
    entry = write_entry(args.repository, args.model, out, config)
    print(f"wrote {entry}/{CONFIG_FILE}:\n{to_text(config)}")
    return 0


def _export_onnx(args: argparse.Namespace, out: Path | None) -> int:
    if out is None:
        out = onnx_export.default_onnx_path(args.cache_dir, args.model, args.seed, args.legacy, args.weights)
    model = onnx_export.build_torchvision_model(args.model, args.seed, args.weights)
    start = time.perf_counter()
    onnx_export.export_onnx(model, out, legacy=args.legacy)
    exporter = "legacy (TorchScript)" if args.legacy else "dynamo (torch.export)"
    print(
        f"exported {args.model} -> {out} with the {exporter} exporter "
        f"in {time.perf_counter() - start:.1f}s; onnx.checker passed"
    )
    sizes = [int(s) for s in args.verify.split(",") if s.strip()]
    ok = True
    for a in onnx_export.compare_with_torch(model, out, sizes):
        good = a.rel_diff <= args.rtol
        ok &= good
        print(
            f"  batch {a.batch_size:>3}: max|diff| {a.max_abs_diff:.3e}  "
            f"max|torch| {a.max_abs_ref:.3e}  relative {a.rel_diff:.2e}  "
            f"{'ok' if good else 'FAIL'}"
        )
    return 0 if ok else 1


# --------------------------------------------------------------------------- build-engine


def add_build_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--onnx", type=Path, default=None, help="ONNX file (default: export)")
    parser.add_argument("--profiles", default=DEFAULT_TRT_PROFILES, help="min:opt:max,...")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--workspace-mib", type=int, default=trt_engine.DEFAULT_WORKSPACE_BYTES >> 20)


def run_build_engine(args: argparse.Namespace) -> int:
    """Build (or find cached) the plan and print where it is. Exit 2, saying what is
    missing, without TensorRT, pycuda or a GPU."""
    try:
        return _build_engine(args)
    except EngineUnavailable as exc:
        print(f"wattserve build-engine: {exc}")
        return 2


def _build_engine(args: argparse.Namespace) -> int:
    trt_engine.import_tensorrt()  # say what is missing before exporting anything
    trt_engine.import_pycuda()
    index = trt_engine.cuda_device_index(args.device)
    profiles = parse_profiles(args.profiles)
    config = EngineConfig(model=args.model, seed=args.seed, onnx_path=args.onnx, cache_dir=args.cache_dir)
    record = trt_engine.load_or_build_plan_on_device(
        index,
        onnx_export.ensure_onnx(config),
        profiles,
        model=args.model,
        fp16=args.fp16,
        cache_dir=args.cache_dir,
        workspace_bytes=args.workspace_mib << 20,
    )
    what = f"built in {record.build_seconds:.1f}s" if record.built else "found in cache"
    print(f"TensorRT plan {record.path} ({what}); key {record.key}")
    print(json.dumps(record.fields, indent=2))
    return 0

"""TensorRT engine: a plan built from the exported ONNX with min/opt/max batch profiles.

Build (``wattserve build-engine``): parse the ONNX file, add one optimization profile per
``settings.trt_profiles`` entry (e.g. 1:1:1, 2:4:8, 8:16:32), optionally fp16, reuse a
timing cache file, and keep the serialized plan in a cache keyed by ONNX hash, GPU name,
TensorRT version, profiles and precision (a plan is valid only for exactly those).

Run: deserialize, one execution context per profile (each bound to its profile once), pick
the profile whose range holds the batch (padding up to the next profile's min when the batch
falls in a gap), set the input shape, copy in, ``execute_async_v3`` on a pycuda stream, copy
back, slice off padding.

Written against the TensorRT 10 Python API and pycuda; neither runs on the machine this was
written on (no GPU), so everything here that does not touch TensorRT is tested there, and the
TensorRT/pycuda calls are exercised by ``scripts/gpu_check.sh`` on a GPU. int8 is not offered:
it needs calibration data we do not have (random weights), and faking it would be dishonest.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.base import NUMPY_TO_DATATYPE, Batch, EngineError, EngineUnavailable, TensorSpec
from engines.profiles import (
    BatchProfile,
    batch_length,
    file_sha256,
    format_profiles,
    pad_batch,
    parse_profiles,
    plan_cache_key,
    plan_file_name,
    profiles_max_batch,
    profiles_opt_sizes,
    select_profile,
)

log = logging.getLogger(__name__)

DEFAULT_WORKSPACE_BYTES = 2 << 30
INSTALL_HINT = (
    "install the 'tensorrt' extra (pip install 'wattserve[tensorrt]': tensorrt>=10 and pycuda) "
    "on a machine with an NVIDIA GPU and driver"
)


# --------------------------------------------------------------------------- availability


def import_tensorrt():
    """The ``tensorrt`` module, or EngineUnavailable saying it is missing."""
    try:
        import tensorrt
    except ImportError as exc:
        raise EngineUnavailable(f"TensorRT is not installed ({exc}); {INSTALL_HINT}") from exc
    return tensorrt


def import_pycuda():
    """``pycuda.driver``, initialised, with at least one GPU; else EngineUnavailable."""
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise EngineUnavailable(f"pycuda is not installed ({exc}); {INSTALL_HINT}") from exc
    try:
        cuda.init()
        count = cuda.Device.count()
    except Exception as exc:  # pycuda raises its own driver errors (no driver, no device)
        raise EngineUnavailable(f"CUDA driver not usable: {exc}") from exc
    if count < 1:
        raise EngineUnavailable("no CUDA GPU found; TensorRT needs one")
    return cuda


def cuda_device_index(device: str) -> int:
    """``auto``/``cuda``/``cuda:N`` -> N; ``cpu`` is an error (TensorRT needs a GPU)."""
    device = device.lower()
    if device in ("auto", "cuda"):
        return 0
    if device.startswith("cuda:"):
        return int(device.split(":", 1)[1])
    raise EngineUnavailable(f"TensorRT runs on a CUDA GPU, not on device {device!r}")


@dataclass(frozen=True)
class GpuIdentity:
    name: str
    compute_capability: str


def gpu_identity(cuda, index: int) -> GpuIdentity:
    dev = cuda.Device(index)
    major, minor = dev.compute_capability()
    return GpuIdentity(dev.name(), f"{major}.{minor}")


def precision_name(fp16: bool) -> str:
    return "fp16" if fp16 else "fp32"


# --------------------------------------------------------------------------- build


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_plan(
    trt,
    onnx_path: Path,
    profiles: Sequence[BatchProfile],
    *,
    fp16: bool,
    timing_cache: Path | None,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
) -> bytes:
    """Build a serialized plan from ``onnx_path`` with one optimization profile per entry.

    Every network input whose axis 0 is dynamic gets ``(min|opt|max, *item_shape)``. The
    timing cache is read from ``timing_cache`` when it exists and written back after the
    build, so later builds (other profiles, other models with the same layers) skip timing.
    """
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if int(trt.__version__.split(".")[0]) < 10:  # explicit batch is implied from 10 on
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"TensorRT could not parse {onnx_path}: {errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if fp16:
        if not hasattr(trt.BuilderFlag, "FP16"):
            raise EngineUnavailable(
                f"TensorRT {trt.__version__} has no BuilderFlag.FP16 (strong typing only); "
                "build fp32 or export an fp16 ONNX graph"
            )
        config.set_flag(trt.BuilderFlag.FP16)

    dynamic_inputs = []
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = tuple(tensor.shape)
        if shape[0] != -1:
            continue
        if any(d < 0 for d in shape[1:]):
            raise EngineError(f"input {tensor.name} has dynamic non-batch dims {shape}")
        dynamic_inputs.append((tensor.name, shape[1:]))
    if not dynamic_inputs:
        raise EngineError(f"{onnx_path} has no input with a dynamic batch axis")
    for p in profiles:
        profile = builder.create_optimization_profile()
        for name, item in dynamic_inputs:
            profile.set_shape(name, (p.min, *item), (p.opt, *item), (p.max, *item))
        config.add_optimization_profile(profile)

    cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.exists() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineError(f"TensorRT failed to build {onnx_path} ({format_profiles(profiles)})")
    if timing_cache is not None:
        _atomic_write(timing_cache, bytes(config.get_timing_cache().serialize()))
    return bytes(plan)


@dataclass(frozen=True)
class PlanRecord:
    """Where a plan lives and what it was built from (also written beside it as JSON)."""

    path: Path
    key: str
    built: bool
    build_seconds: float
    fields: dict


def timing_cache_path(cache_dir: Path, gpu: GpuIdentity, trt_version: str) -> Path:
    safe = "".join(c if c.isalnum() else "_" for c in gpu.name)
    return Path(cache_dir) / "tensorrt" / f"timing-{safe}-sm{gpu.compute_capability}-trt{trt_version}.cache"


def load_or_build_plan(
    trt,
    onnx_path: Path,
    profiles: Sequence[BatchProfile],
    *,
    model: str,
    gpu: GpuIdentity,
    fp16: bool,
    cache_dir: Path,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
) -> PlanRecord:
    """The cached plan for exactly these inputs, building (and caching) it on a miss."""
    fields = {
        "onnx_sha256": file_sha256(onnx_path),
        "gpu": gpu.name,
        "tensorrt": trt.__version__,
        "profiles": format_profiles(profiles),
        "precision": precision_name(fp16),
        "compute_capability": gpu.compute_capability,
    }
    key = plan_cache_key(
        onnx_sha256=fields["onnx_sha256"],
        gpu_name=gpu.name,
        trt_version=trt.__version__,
        profiles=profiles,
        precision=fields["precision"],
        extra={"compute_capability": gpu.compute_capability},
    )
    path = Path(cache_dir) / "tensorrt" / plan_file_name(model, key)
    if path.exists():
        return PlanRecord(path, key, False, 0.0, fields)
    start = time.perf_counter()
    plan = build_plan(
        trt,
        onnx_path,
        profiles,
        fp16=fp16,
        timing_cache=timing_cache_path(cache_dir, gpu, trt.__version__),
        workspace_bytes=workspace_bytes,
    )
    seconds = time.perf_counter() - start
    _atomic_write(path, plan)
    meta = {**fields, "model": model, "onnx": str(onnx_path), "build_seconds": round(seconds, 2)}
    _atomic_write(path.with_suffix(".json"), json.dumps(meta, indent=2).encode())
    log.info("built TensorRT plan %s in %.1fs", path, seconds)
    return PlanRecord(path, key, True, seconds, fields)


# --------------------------------------------------------------------------- run


class TensorRTEngine:
    """A deserialized TensorRT plan with one execution context per optimization profile.

    Blocking and single-threaded like every engine; the CUDA context is pushed around each
    call, so the worker thread that calls ``infer`` need not be the one that built it.
    """

    platform = "tensorrt"

    def __init__(
        self,
        plan: bytes,
        *,
        name: str,
        device_index: int = 0,
        expected_profiles: Sequence[BatchProfile] | None = None,
    ) -> None:
        trt = import_tensorrt()
        cuda = import_pycuda()
        self._trt, self._cuda = trt, cuda
        self.name = name
        self.device = f"cuda:{device_index}"
        self._ctx = cuda.Device(device_index).retain_primary_context()
        self._ctx.push()
        try:
            self._setup(plan, expected_profiles)
        except BaseException:
            self._release()
            cuda.Context.pop()
            self._ctx.detach()
            self._ctx = None
            raise
        cuda.Context.pop()

    def _setup(self, plan: bytes, expected: Sequence[BatchProfile] | None) -> None:
        trt, cuda = self._trt, self._cuda
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise EngineUnavailable(
                "TensorRT could not deserialize the plan (built by another TensorRT version or "
                "for another GPU?); delete it from the cache to rebuild"
            )
        engine = self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        modes = {n: engine.get_tensor_mode(n) for n in names}
        in_names = [n for n in names if modes[n] == trt.TensorIOMode.INPUT]
        out_names = [n for n in names if modes[n] == trt.TensorIOMode.OUTPUT]
        if not in_names:
            raise EngineUnavailable("TensorRT plan has no inputs")

        self.profiles = []
        for index in range(engine.num_optimization_profiles):
            lo, opt, hi = engine.get_tensor_profile_shape(in_names[0], index)
            self.profiles.append(BatchProfile(int(lo[0]), int(opt[0]), int(hi[0])))
        if expected is not None and list(expected) != self.profiles:
            raise EngineUnavailable(
                f"plan profiles {format_profiles(self.profiles)} differ from the requested "
                f"{format_profiles(expected)}"
            )
        self.max_batch_size = profiles_max_batch(self.profiles)
        # Every size some profile runs without padding; None when that is all of 1..max.
        native = sorted({b for p in self.profiles for b in range(p.min, p.max + 1)})
        self.batch_sizes = None if native == list(range(1, self.max_batch_size + 1)) else native
        # What each profile was tuned for: good preferred_batch_sizes for a dynamic batcher.
        self.preferred_batch_sizes = profiles_opt_sizes(self.profiles)

        def spec(n: str, allow_nonfinite: bool = False) -> TensorSpec:
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(n)))
            shape = tuple(int(d) for d in engine.get_tensor_shape(n))
            if any(d < 0 for d in shape[1:]):
                raise EngineUnavailable(f"tensor {n} has dynamic non-batch dims {shape}")
            return TensorSpec(n, shape[1:], NUMPY_TO_DATATYPE[dtype], allow_nonfinite=allow_nonfinite)

        self.inputs = [spec(n) for n in in_names]
        self.outputs = [spec(n, allow_nonfinite=True) for n in out_names]

        # One device buffer per tensor, sized for the largest batch, shared by every context:
        # contexts run one at a time on one stream, so sharing is safe. Pinned host staging
        # buffers make the copies truly asynchronous.
        self._stream = cuda.Stream()
        self._device_buffers = {}
        self._host_buffers = {}
        for s in (*self.inputs, *self.outputs):
            count = self.max_batch_size * s.element_count
            self._host_buffers[s.name] = cuda.pagelocked_empty(count, s.dtype)
            self._device_buffers[s.name] = cuda.mem_alloc(max(1, count * s.dtype.itemsize))

        self._contexts = []
        for index in range(len(self.profiles)):
            context = engine.create_execution_context()
            if context is None:
                raise EngineUnavailable(f"could not create an execution context for profile {index}")
            if not context.set_optimization_profile_async(index, self._stream.handle):
                raise EngineUnavailable(f"could not select optimization profile {index}")
            for name, buf in self._device_buffers.items():
                if not context.set_tensor_address(name, int(buf)):
                    raise EngineUnavailable(f"could not bind tensor {name}")
            self._contexts.append(context)
        self._stream.synchronize()

    @classmethod
    def from_settings(cls, settings) -> TensorRTEngine:
        """Export ONNX if needed, load or build the plan for these settings, deserialize it."""
        from engines.onnx_export import ensure_onnx

        trt = import_tensorrt()
        cuda = import_pycuda()
        index = cuda_device_index(settings.device)
        profiles = parse_profiles(settings.trt_profiles)
        if settings.max_batch_size > profiles_max_batch(profiles):
            raise EngineUnavailable(
                f"max_batch_size {settings.max_batch_size} exceeds the TensorRT profiles' "
                f"largest batch {profiles_max_batch(profiles)} ({settings.trt_profiles})"
            )
        record = load_or_build_plan(
            trt,
            ensure_onnx(settings),
            profiles,
            model=settings.model,
            gpu=gpu_identity(cuda, index),
            fp16=settings.fp16,
            cache_dir=settings.cache_dir,
        )
        engine = cls(
            record.path.read_bytes(),
            name=settings.model,
            device_index=index,
            expected_profiles=profiles,
        )
        engine.plan = record
        return engine

    def padded_size(self, batch_size: int) -> int:
        """The size this batch runs at: itself, or the next profile's min when in a gap."""
        return select_profile(batch_size, self.profiles)[1]

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        try:
            n = batch_length(batch)
            index, run = select_profile(n, self.profiles)
        except ValueError as exc:
            raise EngineError(f"{self.name}: {exc}") from exc
        missing = [s.name for s in self.inputs if s.name not in batch]
        if missing:
            raise EngineError(f"{self.name}: missing inputs {missing}")
        if run > n:
            batch = pad_batch(batch, run)
        cuda = self._cuda
        context = self._contexts[index]
        self._ctx.push()
        try:
            for s in self.inputs:
                arr = np.ascontiguousarray(batch[s.name], dtype=s.dtype)
                if arr.shape[1:] != s.shape:
                    raise EngineError(f"{self.name}: {s.name} items are {arr.shape[1:]}, not {s.shape}")
                host = self._host_buffers[s.name][: arr.size]
                host[:] = arr.reshape(-1)
                cuda.memcpy_htod_async(self._device_buffers[s.name], host, self._stream)
                if not context.set_input_shape(s.name, arr.shape):
                    raise EngineError(f"{self.name}: shape {arr.shape} rejected by profile {index}")
            if not context.execute_async_v3(self._stream.handle):
                raise EngineError(f"{self.name}: TensorRT execution failed (profile {index})")
            shapes = {}
            for s in self.outputs:
                shape = tuple(int(d) for d in context.get_tensor_shape(s.name))
                count = int(np.prod(shape))
                shapes[s.name] = shape
                cuda.memcpy_dtoh_async(
                    self._host_buffers[s.name][:count], self._device_buffers[s.name], self._stream
                )
            self._stream.synchronize()
        finally:
            cuda.Context.pop()
        out = {}
        for name, shape in shapes.items():
            count = int(np.prod(shape))
            out[name] = self._host_buffers[name][:count].reshape(shape)[:n].copy()
        return out

    def _release(self) -> None:
        for buf in getattr(self, "_device_buffers", {}).values():
            buf.free()
        self._device_buffers = {}
        self._host_buffers = {}  # pinned memory: dropped while the CUDA context is current
        self._contexts = []
        self._engine = None
        self._runtime = None

    def close(self) -> None:
        if self._ctx is None:
            return
        self._ctx.push()
        try:
            self._release()
        finally:
            self._cuda.Context.pop()
            self._ctx.detach()
            self._ctx = None


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--onnx", type=Path, default=None, help="ONNX file (default: export)")
    parser.add_argument("--profiles", default="1:1:1,2:4:8,8:16:32", help="min:opt:max,...")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/wattserve"))
    parser.add_argument("--workspace-mib", type=int, default=DEFAULT_WORKSPACE_BYTES >> 20)


def run(args: argparse.Namespace) -> int:
    """``wattserve build-engine``: build (or find cached) the plan and print where it is.
    Exit 2, saying what is missing, without TensorRT, pycuda or a GPU."""
    try:
        return _build(args)
    except EngineUnavailable as exc:
        print(f"wattserve build-engine: {exc}")
        return 2


def _build(args: argparse.Namespace) -> int:
    from engines.onnx_export import ensure_onnx
    from server.settings import Settings

    trt = import_tensorrt()
    cuda = import_pycuda()
    profiles = parse_profiles(args.profiles)
    settings = Settings(model=args.model, seed=args.seed, onnx_path=args.onnx, cache_dir=args.cache_dir)
    record = load_or_build_plan(
        trt,
        ensure_onnx(settings),
        profiles,
        model=args.model,
        gpu=gpu_identity(cuda, cuda_device_index(args.device)),
        fp16=args.fp16,
        cache_dir=args.cache_dir,
        workspace_bytes=args.workspace_mib << 20,
    )
    what = f"built in {record.build_seconds:.1f}s" if record.built else "found in cache"
    print(f"TensorRT plan {record.path} ({what}); key {record.key}")
    print(json.dumps(record.fields, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattserve build-engine", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

"""TensorRT engine: a plan built from the exported ONNX with min/opt/max batch profiles.

Build (``wattserve build-engine``, whose command line is ``server/engine_commands.py``; or
at start-up): parse the ONNX file, add one optimization profile per
``trt_profiles`` entry (e.g. 1:1:1, 2:4:8, 8:16:32), optionally fp16, reuse a
timing cache file, and keep the serialized plan in a cache keyed by ONNX hash, GPU name,
TensorRT version, profiles and precision (a plan is valid only for exactly those).

Run: deserialize, one execution context per profile (each bound to its profile once), pick
the profile whose range holds the batch (padding up to the next profile's min when the batch
falls in a gap), set the input shape, copy in, ``execute_async_v3`` on a pycuda stream, copy
back, slice off padding.

CUDA ownership: every pycuda/TensorRT call of one engine (plan build, deserialize, infer,
release) runs on one thread the engine owns, with the configured GPU's primary context pushed
there for the engine's life. So the plan is built on ``cuda:N`` (TensorRT builds on the
current device), and the stream, buffers and contexts are freed on the thread whose context
they belong to, whichever thread calls ``infer`` or ``close``.

Pinned to TensorRT 10 (``tensorrt-cu12>=10,<11``): TensorRT 11 removed ``BuilderFlag.FP16``
(fp16 comes from the ONNX graph's types there), which this build path relies on. In TensorRT
10's Python API ``set_optimization_profile_async`` raises on failure (and returns True).
``scripts/typecheck_tensorrt.sh`` checks this module against the published TensorRT 10.13
type stubs (tensorrt-stubs); that and the test doubles are the only checks possible here:
TensorRT and pycuda cannot be installed or run in this workplace (no GPU, and TensorRT's
libraries come from a host outside the reachable registries), so the real calls are exercised
only by ``scripts/gpu_check.sh`` on a machine that has them. int8 is not offered: it needs
calibration data we do not have (random weights), and faking it would be dishonest.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from wattserve.engines.base import NUMPY_TO_DATATYPE, Batch, EngineError, EngineUnavailable, TensorSpec
from wattserve.engines.config import EngineConfig
from wattserve.engines.profiles import (
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

if TYPE_CHECKING:  # the published stubs (tensorrt-stubs); at run time the real module or a double
    import tensorrt

log = logging.getLogger(__name__)

DEFAULT_WORKSPACE_BYTES = 2 << 30
TENSORRT_MAJOR = 10  # what this module is written for (pyproject: tensorrt-cu12>=10,<11)
INSTALL_HINT = (
    "install the 'tensorrt' extra (pip install 'wattserve[tensorrt]': tensorrt-cu12>=10,<11 and "
    "pycuda) on a machine with an NVIDIA GPU and driver"
)


# --------------------------------------------------------------------------- availability


def import_tensorrt() -> Any:
    """The ``tensorrt`` module (TensorRT 10), or EngineUnavailable saying what is wrong."""
    try:
        import tensorrt
    except ImportError as exc:
        raise EngineUnavailable(f"TensorRT is not installed ({exc}); {INSTALL_HINT}") from exc
    version = getattr(tensorrt, "__version__", None)
    if version is None:  # e.g. a stubs-only folder imported as a namespace package
        raise EngineUnavailable(f"'tensorrt' here is not TensorRT (no __version__); {INSTALL_HINT}")
    if int(str(version).split(".")[0]) != TENSORRT_MAJOR:
        raise EngineUnavailable(
            f"TensorRT {version} found; this engine is written for TensorRT {TENSORRT_MAJOR} "
            f"(tensorrt-cu12>=10,<11: TensorRT 11 has no BuilderFlag.FP16)"
        )
    return tensorrt


def import_pycuda() -> Any:
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


def gpu_identity(cuda: Any, index: int) -> GpuIdentity:
    dev = cuda.Device(index)
    major, minor = dev.compute_capability()
    return GpuIdentity(dev.name(), f"{major}.{minor}")


def dims(shape: Any) -> tuple[int, ...]:
    """A TensorRT ``Dims`` (indexable, sized; typed as not iterable) as a tuple of ints."""
    return tuple(int(shape[i]) for i in range(len(shape)))


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
    Builds on the current CUDA device: TensorRTEngine calls it on its own thread, with the
    configured GPU's context current.
    """
    import_tensorrt()  # TensorRT 10, or a clear EngineUnavailable
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode from TensorRT 10 on
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"TensorRT could not parse {onnx_path}: {errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)

    dynamic_inputs: list[tuple[str, tuple[int, ...]]] = []
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = dims(tensor.shape)
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
            lo, opt, hi = (trt.Dims([b, *item]) for b in (p.min, p.opt, p.max))
            profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(profile)

    cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.exists() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)

    plan: tensorrt.IHostMemory | None = builder.build_serialized_network(network, config)
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
    onnx_path: Path,
    profiles: Sequence[BatchProfile],
    *,
    model: str,
    gpu: GpuIdentity,
    fp16: bool,
    cache_dir: Path,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
) -> PlanRecord:
    """The cached plan for exactly these inputs, building (and caching) it on a miss.

    A build happens on the current CUDA device: call it where that is the GPU named by
    ``gpu`` (TensorRTEngine.from_config does, on the engine's own thread)."""
    trt = import_tensorrt()
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


def load_or_build_plan_on_device(
    device_index: int,
    onnx_path: Path,
    profiles: Sequence[BatchProfile],
    *,
    model: str,
    fp16: bool,
    cache_dir: Path,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
) -> PlanRecord:
    """``load_or_build_plan`` on GPU ``device_index``, from a thread that owns no CUDA context
    (the command line): that GPU's primary context is current for the build, then released."""
    import_tensorrt()
    cuda = import_pycuda()
    context = cuda.Device(device_index).retain_primary_context()
    context.push()  # TensorRT builds on the current device: make it the one asked for
    try:
        return load_or_build_plan(
            onnx_path,
            profiles,
            model=model,
            gpu=gpu_identity(cuda, device_index),
            fp16=fp16,
            cache_dir=cache_dir,
            workspace_bytes=workspace_bytes,
        )
    finally:
        cuda.Context.pop()
        context.detach()


# --------------------------------------------------------------------------- run


class TensorRTEngine:
    """A deserialized TensorRT plan with one execution context per optimization profile.

    Blocking like every engine. Every CUDA call runs on the engine's own thread (``_owner``),
    where the configured GPU's primary context stays pushed from construction to ``close``:
    the plan is built and deserialized on that GPU, and the stream, buffers and contexts are
    released by the thread that owns them, whichever thread calls ``infer`` or ``close``.
    """

    platform = "tensorrt"

    def __init__(
        self,
        plan: bytes | None,
        *,
        name: str,
        device_index: int = 0,
        expected_profiles: Sequence[BatchProfile] | None = None,
        build: Callable[[], PlanRecord] | None = None,
    ) -> None:
        import_tensorrt()
        self._cuda = import_pycuda()
        self.name = name
        self.device = f"cuda:{device_index}"
        self.plan: PlanRecord | None = None
        self._ctx: Any = None
        self._owner: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"tensorrt-{name}-cuda{device_index}"
        )
        try:
            self._on_owner(self._open, plan, device_index, expected_profiles, build)
        except BaseException:
            self._owner.shutdown(wait=True)
            self._owner = None
            raise

    def _on_owner(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._owner is None:
            raise EngineError(f"{self.name}: engine is closed")
        return self._owner.submit(fn, *args).result()

    def _open(
        self,
        plan: bytes | None,
        device_index: int,
        expected: Sequence[BatchProfile] | None,
        build: Callable[[], PlanRecord] | None,
    ) -> None:
        """Owner thread: make the GPU's context current here, build if asked, deserialize."""
        cuda = self._cuda
        self._ctx = cuda.Device(device_index).retain_primary_context()
        self._ctx.push()
        try:
            if build is not None:
                self.plan = build()
                plan = self.plan.path.read_bytes()
            if plan is None:
                raise EngineUnavailable("no plan given and nothing to build it from")
            self._setup(plan, expected)
        except BaseException:
            self._release_on_owner()
            raise

    def _setup(self, plan: bytes, expected: Sequence[BatchProfile] | None) -> None:
        import tensorrt as trt  # checked by import_tensorrt(); typed by the stubs

        cuda = self._cuda
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime: tensorrt.Runtime | None = trt.Runtime(self._logger)
        engine: tensorrt.ICudaEngine | None = self._runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise EngineUnavailable(
                "TensorRT could not deserialize the plan (built by another TensorRT version or "
                "for another GPU?); delete it from the cache to rebuild"
            )
        self._engine: tensorrt.ICudaEngine | None = engine
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

        def spec(n: str) -> TensorSpec:
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(n)))
            shape = dims(engine.get_tensor_shape(n))
            if any(d < 0 for d in shape[1:]):
                raise EngineUnavailable(f"tensor {n} has dynamic non-batch dims {shape}")
            return TensorSpec(n, shape[1:], NUMPY_TO_DATATYPE[dtype])

        self.inputs = [spec(n) for n in in_names]
        self.outputs = [spec(n) for n in out_names]

        # One device buffer per tensor, sized for the largest batch, shared by every context:
        # contexts run one at a time on one stream, so sharing is safe. Pinned host staging
        # buffers make the copies truly asynchronous.
        self._stream = cuda.Stream()
        self._device_buffers: dict[str, Any] = {}
        self._host_buffers: dict[str, np.ndarray] = {}
        for s in (*self.inputs, *self.outputs):
            count = self.max_batch_size * s.element_count
            self._host_buffers[s.name] = cuda.pagelocked_empty(count, s.dtype)
            self._device_buffers[s.name] = cuda.mem_alloc(max(1, count * s.dtype.itemsize))

        self._contexts: list[tensorrt.IExecutionContext] = []
        for index in range(len(self.profiles)):
            context: tensorrt.IExecutionContext | None = engine.create_execution_context()
            if context is None:
                raise EngineUnavailable(f"could not create an execution context for profile {index}")
            self._contexts.append(context)  # released with the others if a later step fails
            try:  # TensorRT 10 raises on failure (its binding turns False into RuntimeError)
                selected = context.set_optimization_profile_async(index, self._stream.handle)
            except Exception as exc:
                raise EngineUnavailable(f"could not select optimization profile {index}: {exc}") from exc
            if selected is False:
                raise EngineUnavailable(f"could not select optimization profile {index}")
            for name, buf in self._device_buffers.items():
                if not context.set_tensor_address(name, int(buf)):
                    raise EngineUnavailable(f"could not bind tensor {name}")
        self._stream.synchronize()

    @classmethod
    def from_config(cls, config: EngineConfig) -> TensorRTEngine:
        """Export ONNX if needed; load or build the plan on ``config.device``; deserialize it."""
        from wattserve.engines.onnx_export import ensure_onnx

        import_tensorrt()
        cuda = import_pycuda()
        index = cuda_device_index(config.device)
        profiles = parse_profiles(config.trt_profiles)
        if config.max_batch_size > profiles_max_batch(profiles):
            raise EngineUnavailable(
                f"max_batch_size {config.max_batch_size} exceeds the TensorRT profiles' "
                f"largest batch {profiles_max_batch(profiles)} ({config.trt_profiles})"
            )
        onnx_path = ensure_onnx(config)

        def build() -> PlanRecord:  # on the engine's thread, cuda:index current
            return load_or_build_plan(
                onnx_path,
                profiles,
                model=config.model,
                gpu=gpu_identity(cuda, index),
                fp16=config.fp16,
                cache_dir=config.cache_dir,
            )

        return cls(None, name=config.model, device_index=index, expected_profiles=profiles, build=build)

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
        return self._on_owner(self._run, batch, index, n)

    def _run(self, batch: Batch, index: int, n: int) -> dict[str, np.ndarray]:
        """Owner thread (its context current): copy in, execute, copy out, slice."""
        cuda = self._cuda
        context = self._contexts[index]
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
            shape = dims(context.get_tensor_shape(s.name))
            count = int(np.prod(shape))
            shapes[s.name] = shape
            cuda.memcpy_dtoh_async(
                self._host_buffers[s.name][:count], self._device_buffers[s.name], self._stream
            )
        self._stream.synchronize()
        out = {}
        for name, shape in shapes.items():
            count = int(np.prod(shape))
            out[name] = self._host_buffers[name][:count].reshape(shape)[:n].copy()
        return out

    def _release_on_owner(self) -> None:
        """Owner thread: free everything CUDA while this thread's context is current, then pop
        and release the context. TensorRT objects go contexts -> engine -> runtime."""
        try:
            if hasattr(self, "_stream"):
                self._stream.synchronize()
            for buf in getattr(self, "_device_buffers", {}).values():
                buf.free()
            for host in getattr(self, "_host_buffers", {}).values():
                base = getattr(host, "base", None)
                if base is not None and hasattr(base, "free"):
                    base.free()  # pinned memory, freed in its context
            self._device_buffers, self._host_buffers = {}, {}
            self._contexts = []
            self._engine = None
            self._runtime = None
            self.__dict__.pop("_stream", None)  # pycuda frees the stream here, in its context
        finally:
            if self._ctx is not None:
                self._cuda.Context.pop()
                self._ctx.detach()
                self._ctx = None

    def close(self) -> None:
        if self._owner is None:
            return
        try:
            self._on_owner(self._release_on_owner)
        finally:
            self._owner.shutdown(wait=True)
            self._owner = None

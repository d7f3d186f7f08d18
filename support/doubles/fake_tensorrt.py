"""FakeTensorRT and FakePycuda: test doubles for TensorRT and a CUDA GPU (absent here).

They mirror the subset of the TensorRT 10 Python API and ``pycuda.driver`` that
``engines/tensorrt_engine.py`` calls, with the same names and failure conventions (``set_*``
return bools, except ``set_optimization_profile_async``, which TensorRT 10's binding makes
raise RuntimeError on failure; a failed build returns None, a bad plan deserializes to None),
and they check what TensorRT checks at those calls: profile shapes min <= opt <= max for every
dynamic input, an input shape inside the context's own profile, every tensor bound before
execution. "Device" memory is host bytes and "kernels" are ONNX Runtime on the CPU, so outputs
are real.

CUDA contexts are per thread, as in CUDA: the driver double keeps one context stack per
thread, a build records the device current on the building thread, and freeing memory or a
stream on a thread where its context is not current raises (pycuda's "invalid context"). Every
release is recorded (``driver.releases``) so tests can check who released what, where.

They are NOT TensorRT: plan format, timing-cache contents, precision and speed are invented.
The real libraries are exercised only by scripts/gpu_check.sh on a GPU.
"""

from __future__ import annotations

import enum
import itertools
import json
import threading
import types
from dataclasses import dataclass, field

import numpy as np

# ----------------------------------------------------------------------------- tensorrt


class _Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class FakeLogger:
    INTERNAL_ERROR = _Severity.INTERNAL_ERROR
    ERROR = _Severity.ERROR
    WARNING = _Severity.WARNING
    INFO = _Severity.INFO
    VERBOSE = _Severity.VERBOSE

    def __init__(self, severity=_Severity.WARNING) -> None:
        self.severity = severity


class BuilderFlag(enum.IntEnum):
    FP16 = 0
    TF32 = 7


class BuilderFlagNoFp16(enum.IntEnum):
    """TensorRT 11's BuilderFlag: FP16 removed (strong typing only)."""

    TF32 = 7


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class NetworkDefinitionCreationFlag(enum.IntEnum):
    EXPLICIT_BATCH = 0
    STRONGLY_TYPED = 1


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1


class Dims(tuple):
    """TensorRT's Dims: built from a list of ints, behaves like a tuple."""

    def __new__(cls, shape=()):
        return super().__new__(cls, (int(d) for d in shape))


def nptype(dtype: DataType):
    return {DataType.FLOAT: np.float32, DataType.HALF: np.float16}[dtype]


@dataclass
class FakeITensor:
    name: str
    shape: tuple[int, ...]


@dataclass
class FakeNetwork:
    flags: int
    inputs: list[FakeITensor] = field(default_factory=list)
    outputs: list[FakeITensor] = field(default_factory=list)
    onnx_path: str | None = None

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> FakeITensor:
        return self.inputs[i]


class FakeOnnxParser:
    def __init__(self, network: FakeNetwork, logger: FakeLogger) -> None:
        self.network = network
        self.errors: list[str] = []

    def parse_from_file(self, path: str) -> bool:
        import onnx

        try:
            model = onnx.load(path)
            onnx.checker.check_model(model)
        except Exception as exc:
            self.errors.append(f"ONNX parse error: {exc}")
            return False

        def dims(value_info) -> tuple[int, ...]:
            return tuple(
                d.dim_value if d.HasField("dim_value") else -1 for d in value_info.type.tensor_type.shape.dim
            )

        self.network.inputs = [FakeITensor(i.name, dims(i)) for i in model.graph.input]
        self.network.outputs = [FakeITensor(o.name, dims(o)) for o in model.graph.output]
        self.network.onnx_path = path
        return True

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, i: int) -> str:
        return self.errors[i]


class FakeOptimizationProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}

    def set_shape(self, name, min, opt, max) -> None:
        self.shapes[name] = (tuple(min), tuple(opt), tuple(max))


class FakeTimingCache:
    def __init__(self, data: bytes) -> None:
        self.entries: list[str] = json.loads(data.decode()) if data else []

    def serialize(self) -> bytes:
        return json.dumps(self.entries).encode()


class FakeBuilderConfig:
    def __init__(self) -> None:
        self.flags: set[int] = set()
        self.pools: dict[int, int] = {}
        self.profiles: list[FakeOptimizationProfile] = []
        self.timing_cache: FakeTimingCache | None = None

    def set_memory_pool_limit(self, pool, size: int) -> None:
        self.pools[int(pool)] = size

    def set_flag(self, flag) -> None:
        self.flags.add(int(flag))

    def add_optimization_profile(self, profile: FakeOptimizationProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, data: bytes) -> FakeTimingCache:
        return FakeTimingCache(bytes(data))

    def set_timing_cache(self, cache: FakeTimingCache, ignore_mismatch: bool) -> bool:
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> FakeTimingCache | None:
        return self.timing_cache


class FakeBuilder:
    def __init__(self, module: FakeTensorRT, logger: FakeLogger) -> None:
        self.module = module

    def create_network(self, flags: int = 0) -> FakeNetwork:
        return FakeNetwork(flags)

    def create_builder_config(self) -> FakeBuilderConfig:
        return FakeBuilderConfig()

    def create_optimization_profile(self) -> FakeOptimizationProfile:
        return FakeOptimizationProfile()

    def build_serialized_network(self, network: FakeNetwork, config: FakeBuilderConfig):
        dynamic = [t.name for t in network.inputs if t.shape[0] == -1]
        if dynamic and not config.profiles:
            return None
        profiles = []
        for p in config.profiles:
            if sorted(p.shapes) != sorted(dynamic):
                return None
            for name, (lo, opt, hi) in p.shapes.items():
                item = next(t.shape[1:] for t in network.inputs if t.name == name)
                if any(s[1:] != item for s in (lo, opt, hi)) or not lo[0] <= opt[0] <= hi[0]:
                    return None
            profiles.append({k: [list(s) for s in v] for k, v in p.shapes.items()})
        self.module.builds.append(
            {
                "onnx": network.onnx_path,
                "profiles": profiles,
                "flags": sorted(config.flags),
                "device": self.module.pycuda.current_device(),  # TensorRT builds on the current one
            }
        )
        if config.timing_cache is not None:
            config.timing_cache.entries.append(f"build-{len(self.module.builds)}")
        plan = {
            "magic": "fake-tensorrt-plan",
            "onnx": network.onnx_path,
            "profiles": profiles,
            "fp16": int(BuilderFlag.FP16) in config.flags,
            "inputs": {t.name: list(t.shape) for t in network.inputs},
            "outputs": {t.name: list(t.shape) for t in network.outputs},
        }
        return json.dumps(plan).encode()


class FakeRuntime:
    def __init__(self, module: FakeTensorRT, logger: FakeLogger) -> None:
        self.module = module

    def deserialize_cuda_engine(self, plan: bytes):
        try:
            data = json.loads(bytes(plan).decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        if data.get("magic") != "fake-tensorrt-plan":
            return None
        return FakeCudaEngine(self.module, data)


class FakeCudaEngine:
    def __init__(self, module: FakeTensorRT, plan: dict) -> None:
        import onnxruntime as ort

        self.module = module
        self.plan = plan
        self.names = [*plan["inputs"], *plan["outputs"]]
        self.session = ort.InferenceSession(plan["onnx"], providers=["CPUExecutionProvider"])
        self.contexts: list[FakeExecutionContext] = []

    @property
    def num_io_tensors(self) -> int:
        return len(self.names)

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.plan["profiles"])

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        if name in self.plan["inputs"]:
            return TensorIOMode.INPUT
        return TensorIOMode.OUTPUT if name in self.plan["outputs"] else TensorIOMode.NONE

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType.FLOAT

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.plan["inputs"].get(name) or self.plan["outputs"][name])

    def get_tensor_profile_shape(self, name: str, index: int) -> list[tuple[int, ...]]:
        return [tuple(s) for s in self.plan["profiles"][index][name]]

    def create_execution_context(self) -> FakeExecutionContext:
        context = FakeExecutionContext(self)
        self.contexts.append(context)
        return context


class FakeExecutionContext:
    def __init__(self, engine: FakeCudaEngine) -> None:
        self.engine = engine
        self.profile = 0
        self.input_shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.executions: list[tuple[int, int]] = []  # (profile, batch) per execute_async_v3

    def set_optimization_profile_async(self, index: int, stream_handle: int) -> bool:
        # TensorRT 10's Python binding throws where the C++ call returns false
        if not 0 <= index < self.engine.num_optimization_profiles or self.engine.module.fail_profile_select:
            raise RuntimeError("Error in set optimization profile async.")
        self.profile = index
        self.input_shapes.clear()
        return True

    def set_input_shape(self, name: str, shape) -> bool:
        shape = tuple(int(d) for d in shape)
        if name not in self.engine.plan["inputs"]:
            return False
        lo, _, hi = self.engine.plan["profiles"][self.profile][name]
        if len(shape) != len(lo) or any(not a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True)):
            return False
        self.input_shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, address: int) -> bool:
        if name not in self.engine.names:
            return False
        self.addresses[name] = int(address)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        if name in self.input_shapes:
            return self.input_shapes[name]
        shape = self.engine.get_tensor_shape(name)
        if name in self.engine.plan["outputs"] and self.input_shapes:
            batch = next(iter(self.input_shapes.values()))[0]
            return (batch, *shape[1:])
        return shape

    def execute_async_v3(self, stream_handle: int) -> bool:
        plan = self.engine.plan
        if set(self.input_shapes) != set(plan["inputs"]) or set(self.addresses) != set(self.engine.names):
            return False
        memory = self.engine.module.pycuda.memory
        feeds = {}
        for name, shape in self.input_shapes.items():
            count = int(np.prod(shape))
            raw = memory.read(self.addresses[name], count * 4)
            feeds[name] = np.frombuffer(raw, dtype=np.float32).reshape(shape)
        results = self.engine.session.run(list(plan["outputs"]), feeds)
        for name, value in zip(plan["outputs"], results, strict=True):
            memory.write(self.addresses[name], np.ascontiguousarray(value, np.float32).tobytes())
        batch = next(iter(self.input_shapes.values()))[0]
        self.executions.append((self.profile, batch))
        return True


class FakeTensorRT(types.ModuleType):
    """A stand-in ``tensorrt`` module; ``builds`` records every plan it built."""

    def __init__(self, pycuda: FakePycudaDriver, version: str = "10.8.0.43", fp16: bool = True):
        super().__init__("tensorrt")
        self.__version__ = version
        self.pycuda = pycuda
        self.builds: list[dict] = []
        self.fail_profile_select = False  # make set_optimization_profile_async fail
        self.Logger = FakeLogger
        self.BuilderFlag = BuilderFlag if fp16 else BuilderFlagNoFp16
        self.MemoryPoolType = MemoryPoolType
        self.NetworkDefinitionCreationFlag = NetworkDefinitionCreationFlag
        self.TensorIOMode = TensorIOMode
        self.DataType = DataType
        self.nptype = nptype
        self.Dims = Dims
        self.OnnxParser = FakeOnnxParser
        self.Builder = lambda logger: FakeBuilder(self, logger)
        self.Runtime = lambda logger: FakeRuntime(self, logger)


# ----------------------------------------------------------------------------- pycuda


class FakeDeviceMemory:
    """Host bytes standing in for GPU memory, addressed by fake device pointers."""

    def __init__(self) -> None:
        self.blocks: dict[int, bytearray] = {}
        self._next = itertools.count(0x7F0000000000, 1 << 32)

    def alloc(self, size: int) -> int:
        address = next(self._next)
        self.blocks[address] = bytearray(size)
        return address

    def read(self, address: int, size: int) -> bytes:
        block = self.blocks[address]
        if size > len(block):
            raise ValueError(f"read of {size} bytes from a {len(block)}-byte allocation")
        return bytes(block[:size])

    def write(self, address: int, data: bytes) -> None:
        block = self.blocks[address]
        if len(data) > len(block):
            raise ValueError(f"write of {len(data)} bytes into a {len(block)}-byte allocation")
        block[: len(data)] = data


class FakeDeviceAllocation:
    def __init__(self, driver: FakePycudaDriver, size: int) -> None:
        self.driver = driver
        self.memory = driver.memory
        self.device = driver.require_context("cuMemAlloc")
        self.address = self.memory.alloc(size)
        self.freed = False

    def __int__(self) -> int:
        return self.address

    def free(self) -> None:
        if self.freed:
            return
        self.driver.release("device memory", self.device)
        self.memory.blocks.pop(self.address, None)
        self.freed = True


class FakeHostAllocation:
    """Pinned host memory: what ``pagelocked_empty(...).base`` is in pycuda (has ``free``)."""

    def __init__(self, driver: FakePycudaDriver, shape, dtype) -> None:
        self.driver = driver
        self.device = driver.require_context("cuMemHostAlloc")
        self.array = np.empty(shape, dtype)
        self.__array_interface__ = self.array.__array_interface__
        self.freed = False

    def free(self) -> None:
        if not self.freed:
            self.driver.release("pinned host memory", self.device)
            self.freed = True


class FakeStream:
    _handles = itertools.count(0x1000)

    def __init__(self, driver: FakePycudaDriver) -> None:
        self.driver = driver
        self.device = driver.require_context("cuStreamCreate")
        self.handle = next(self._handles)
        self.synchronized = 0

    def synchronize(self) -> None:
        self.driver.require_context("cuStreamSynchronize")
        self.synchronized += 1

    def __del__(self) -> None:
        try:
            self.driver.release("stream", self.device)
        except RuntimeError as exc:  # a destructor cannot raise: keep it for the test to see
            self.driver.errors.append(str(exc))


class FakePycudaDriver(types.ModuleType):
    """A stand-in ``pycuda.driver`` with ``gpus`` fake devices; tracks the context stack."""

    def __init__(self, gpus: int = 1, name: str = "Fake GPU (test double)") -> None:
        super().__init__("pycuda.driver")
        self.memory = FakeDeviceMemory()
        self._stacks = threading.local()  # CUDA: the current context is per thread
        self.allocations: list[FakeDeviceAllocation] = []
        self.host_allocations: list[FakeHostAllocation] = []
        self.releases: list[dict] = []  # what was freed, on which thread, with which device current
        self.errors: list[str] = []  # releases that failed inside destructors
        self.contexts: list[object] = []
        driver = self

        class Context:
            def __init__(self, device_index: int) -> None:
                self.device_index = device_index
                self.detached = False
                self.pushed_on: set[int] = set()
                driver.contexts.append(self)

            def push(self) -> None:
                driver.context_stack.append(self)
                self.pushed_on.add(threading.get_ident())

            @staticmethod
            def pop() -> None:
                driver.context_stack.pop()

            def detach(self) -> None:
                self.detached = True

        class Device:
            def __init__(self, index: int) -> None:
                if not 0 <= index < gpus:
                    raise RuntimeError(f"cuDeviceGet failed: invalid device ordinal {index}")
                self.index = index

            @staticmethod
            def count() -> int:
                return gpus

            def name(self) -> str:
                return name

            def compute_capability(self) -> tuple[int, int]:
                return (9, 0)

            def retain_primary_context(self):
                return Context(self.index)

        self.Context = Context
        self.Device = Device
        self.Stream = lambda: FakeStream(self)

    @property
    def context_stack(self) -> list:
        """The calling thread's context stack."""
        if not hasattr(self._stacks, "stack"):
            self._stacks.stack = []
        return self._stacks.stack

    def current_device(self) -> int | None:
        stack = self.context_stack
        return stack[-1].device_index if stack else None

    def require_context(self, call: str) -> int:
        device = self.current_device()
        if device is None:
            raise RuntimeError(f"{call} failed: invalid device context (none current on this thread)")
        return device

    def release(self, what: str, device: int) -> None:
        current = self.current_device()
        self.releases.append({"what": what, "thread": threading.get_ident(), "device": device,
                              "current": current})  # fmt: skip
        if current != device:
            raise RuntimeError(f"freeing {what} of device {device} with context {current} current")

    def init(self) -> None:
        pass

    def mem_alloc(self, size: int) -> FakeDeviceAllocation:
        allocation = FakeDeviceAllocation(self, size)
        self.allocations.append(allocation)
        return allocation

    def pagelocked_empty(self, shape, dtype) -> np.ndarray:
        allocation = FakeHostAllocation(self, shape, dtype)
        self.host_allocations.append(allocation)
        return np.asarray(allocation)

    def memcpy_htod_async(self, dest, src: np.ndarray, stream=None) -> None:
        self._require_context()
        self.memory.write(int(dest), np.ascontiguousarray(src).tobytes())

    def memcpy_dtoh_async(self, dest: np.ndarray, src, stream=None) -> None:
        self._require_context()
        raw = self.memory.read(int(src), dest.nbytes)
        dest[...] = np.frombuffer(raw, dtype=dest.dtype).reshape(dest.shape)

    def _require_context(self) -> None:
        self.require_context("cuMemcpy")


def install(monkeypatch, *, gpus: int = 1, version: str = "10.8.0.43", fp16: bool = True):
    """Put FakeTensorRT/FakePycuda into ``sys.modules``; returns ``(trt, driver)``."""
    import sys

    driver = FakePycudaDriver(gpus=gpus)
    trt = FakeTensorRT(driver, version=version, fp16=fp16)
    package = types.ModuleType("pycuda")
    package.driver = driver
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    return trt, driver

"""The slice of the ``pynvml`` module (nvidia-ml-py) wattserve calls, answered from Python.

One implementation of that surface serves two users, each naming itself for what it is:

- ``support/doubles/fake_nvml.py``: ``FakeNvml``, the TEST DOUBLE whose GPUs run on a
  simulated clock that tests advance;
- ``telemetry/simulated_gpu.py``: ``SimulatedNvml``, the server's simulated GPU
  (``WATTSERVE_SIMULATED_GPU``), whose power follows the engines' real busy time.

It reuses nvidia-ml-py's own pure-Python pieces (constants, ``NVMLError`` classes, the ctypes
structs) so error handling and field parsing in ``telemetry/nvml_gpu.py`` run their real code
paths; only the calls into libnvidia-ml.so are answered here. A device is any object with the
attributes ``FakeGpu`` has (``NvmlDevice``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import SimpleNamespace
from typing import Any, Protocol

import pynvml as _real

NVMLError = _real.NVMLError
NVML_SUCCESS = _real.NVML_SUCCESS
NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_UNINITIALIZED = _real.NVML_ERROR_UNINITIALIZED
NVML_FI_DEV_POWER_INSTANT = _real.NVML_FI_DEV_POWER_INSTANT
NVML_CLOCK_SM = _real.NVML_CLOCK_SM
NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU
NVML_VALUE_TYPE_UNSIGNED_INT = _real.NVML_VALUE_TYPE_UNSIGNED_INT


class NvmlDevice(Protocol):
    """What the surface reads of one device (``FakeGpu``, ``SimulatedGpu``)."""

    name: str
    uuid: str
    calls: dict[str, int]
    failing: int | None
    unsupported: set[str]
    has_energy_counter: bool
    has_instant_power: bool
    average_power_w: float | None
    power_limit_w: float
    utilization: int
    memory_utilization: int
    memory_used: int
    memory_total: int
    sm_clock_mhz: int
    temperature_c: int

    @property
    def current_power_w(self) -> float: ...

    def counter_reading_mj(self) -> int: ...

    def moving_average_w(self, now: float, window_s: float = 1.0) -> float: ...


class NvmlSurface(ABC):
    """Drop-in for ``import pynvml`` over ``self.gpus``; subclasses give ``clock`` and may
    run something before every device call (``_before_call``)."""

    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_FI_DEV_POWER_INSTANT = NVML_FI_DEV_POWER_INSTANT
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(self, gpus: list[Any], init_error: int | None = None):
        self.gpus = gpus
        self.init_error = init_error
        self.initialized = False
        self.shutdowns = 0

    @abstractmethod
    def clock(self) -> float:
        """Seconds on the GPU's clock (a test's manual clock, or the simulator's)."""

    def _before_call(self) -> None:
        """Hook: e.g. let real time pass on a simulated clock."""
        return None

    def _gpu(self, handle: object, call: str) -> Any:
        self._before_call()
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        gpu = handle.gpu  # type: ignore[attr-defined]
        gpu.calls[call] = gpu.calls.get(call, 0) + 1
        if gpu.failing is not None:
            raise NVMLError(gpu.failing)
        if call in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return SimpleNamespace(gpu=self.gpus[index], index=index)

    def nvmlDeviceGetName(self, handle: object) -> str:
        return str(self._gpu(handle, "name").name)

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return str(self._gpu(handle, "uuid").uuid)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        gpu = self._gpu(handle, "energy")
        if not gpu.has_energy_counter:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(gpu.counter_reading_mj())

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        gpu = self._gpu(handle, "power_usage")
        if gpu.average_power_w is not None:
            return round(gpu.average_power_w * 1000)
        return round(gpu.moving_average_w(self.clock()) * 1000)

    def nvmlDeviceGetFieldValues(self, handle: object, field_ids: list[int]) -> Any:
        gpu = self._gpu(handle, "field_values")
        values = (_real.c_nvmlFieldValue_t * len(field_ids))()
        for i, field_id in enumerate(field_ids):
            values[i].fieldId = field_id
            if field_id == NVML_FI_DEV_POWER_INSTANT and gpu.has_instant_power:
                values[i].nvmlReturn = NVML_SUCCESS
                values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = round(gpu.current_power_w * 1000)
            else:
                values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> int:
        return int(self._gpu(handle, "power_limit").power_limit_w * 1000)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
        gpu = self._gpu(handle, "utilization")
        util = _real.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.utilization, gpu.memory_utilization
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: Any = None) -> Any:
        gpu = self._gpu(handle, "memory")
        mem = _real.c_nvmlMemory_t()
        mem.total, mem.used = gpu.memory_total, gpu.memory_used
        mem.free = gpu.memory_total - gpu.memory_used
        return mem

    def nvmlDeviceGetClockInfo(self, handle: object, clock_type: int) -> int:
        gpu = self._gpu(handle, "clock")
        assert clock_type == NVML_CLOCK_SM
        return int(gpu.sm_clock_mhz)

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        gpu = self._gpu(handle, "temperature")
        assert sensor == NVML_TEMPERATURE_GPU
        return int(gpu.temperature_c)

"""FakeNvml: a TEST DOUBLE of the slice of the ``pynvml`` module (nvidia-ml-py) wattserve uses.

This machine has no GPU, so the telemetry arithmetic is tested against simulated GPUs whose
power the test sets and whose energy counter advances with a simulated clock. The double
reuses nvidia-ml-py's own pure-Python pieces (constants, ``NVMLError`` classes, the ctypes
field-value struct) so error handling and field parsing run the real code paths; only the
calls into libnvidia-ml.so are simulated. It is never used outside tests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml as _real

NVMLError = _real.NVMLError
NVML_SUCCESS = _real.NVML_SUCCESS
NVML_ERROR_NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_GPU_IS_LOST = _real.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_LIBRARY_NOT_FOUND = _real.NVML_ERROR_LIBRARY_NOT_FOUND
NVML_ERROR_UNINITIALIZED = _real.NVML_ERROR_UNINITIALIZED
NVML_FI_DEV_POWER_INSTANT = _real.NVML_FI_DEV_POWER_INSTANT
NVML_CLOCK_SM = _real.NVML_CLOCK_SM
NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU
NVML_VALUE_TYPE_UNSIGNED_INT = _real.NVML_VALUE_TYPE_UNSIGNED_INT


@dataclass
class FakeGpu:
    """One simulated GPU. Power in watts; the counter integrates it exactly over fake time."""

    name: str = "Fake GPU (test double)"
    uuid: str = "GPU-00000000-fake"
    power_w: float = 100.0  # what the instant field reads
    average_power_w: float | None = None  # what nvmlDeviceGetPowerUsage reads (default: power_w)
    power_limit_w: float = 700.0
    energy_mj: float = 1_000_000.0  # counter since "driver load"
    has_energy_counter: bool = True
    has_instant_power: bool = True
    utilization: int = 50
    memory_utilization: int = 20
    memory_used: int = 10 * 2**30
    memory_total: int = 141 * 2**30
    sm_clock_mhz: int = 1980
    temperature_c: int = 45
    failing: int | None = None  # an NVML error code every call raises while set
    unsupported: set[str] = field(default_factory=set)  # calls answering NOT_SUPPORTED
    calls: dict[str, int] = field(default_factory=dict)


class FakeNvml:
    """Drop-in for ``import pynvml``: pass an instance where the code takes ``nvml=``."""

    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_FI_DEV_POWER_INSTANT = NVML_FI_DEV_POWER_INSTANT
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(self, gpus: list[FakeGpu] | None = None, init_error: int | None = None):
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.now = 0.0  # simulated seconds, advanced only by advance()
        self.initialized = False
        self.shutdowns = 0
        self._lock = threading.Lock()

    # --- test controls ---
    def clock(self) -> float:
        """The simulated monotonic clock (pass as ``clock=`` to power integration)."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Let simulated time pass; every GPU's counter gains power * time."""
        with self._lock:
            self.now += seconds
            for gpu in self.gpus:
                gpu.energy_mj += gpu.power_w * seconds * 1000.0

    # --- the pynvml API surface ---
    def _gpu(self, handle: object, call: str) -> FakeGpu:
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
        return self._gpu(handle, "name").name

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        return self._gpu(handle, "uuid").uuid

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        gpu = self._gpu(handle, "energy")
        if not gpu.has_energy_counter:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(gpu.energy_mj)

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        gpu = self._gpu(handle, "power_usage")
        watts = gpu.power_w if gpu.average_power_w is None else gpu.average_power_w
        return round(watts * 1000)

    def nvmlDeviceGetFieldValues(self, handle: object, field_ids: list[int]):
        gpu = self._gpu(handle, "field_values")
        values = (_real.c_nvmlFieldValue_t * len(field_ids))()
        for i, field_id in enumerate(field_ids):
            values[i].fieldId = field_id
            if field_id == NVML_FI_DEV_POWER_INSTANT and gpu.has_instant_power:
                values[i].nvmlReturn = NVML_SUCCESS
                values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = round(gpu.power_w * 1000)
            else:
                values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> int:
        return int(self._gpu(handle, "power_limit").power_limit_w * 1000)

    def nvmlDeviceGetUtilizationRates(self, handle: object):
        gpu = self._gpu(handle, "utilization")
        util = _real.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.utilization, gpu.memory_utilization
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: object, version=None):
        gpu = self._gpu(handle, "memory")
        mem = _real.c_nvmlMemory_t()
        mem.total, mem.used = gpu.memory_total, gpu.memory_used
        mem.free = gpu.memory_total - gpu.memory_used
        return mem

    def nvmlDeviceGetClockInfo(self, handle: object, clock_type: int) -> int:
        gpu = self._gpu(handle, "clock")
        assert clock_type == NVML_CLOCK_SM
        return gpu.sm_clock_mhz

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        gpu = self._gpu(handle, "temperature")
        assert sensor == NVML_TEMPERATURE_GPU
        return gpu.temperature_c

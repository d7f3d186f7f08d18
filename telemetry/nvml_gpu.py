"""One GPU seen through NVML: what it supports, and its readings in base units.

The ``pynvml`` module (from nvidia-ml-py) is passed in, so a test double can stand in for it
on machines without a GPU. Only functions that exist in nvidia-ml-py are called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

_VALUE_FIELDS = {  # nvmlValueType_t -> member of the c_nvmlValue_t union
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class GpuStatus:
    """One sample of everything the exporter shows about a GPU (energy excluded).

    A field is None where this GPU does not support the reading (e.g. utilization under
    MIG); such series are simply not exported.
    """

    power_average_w: float | None
    power_instant_w: float | None
    power_limit_w: float | None
    utilization: float | None  # 0..1
    memory_utilization: float | None  # 0..1
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    sm_clock_hz: float | None
    temperature_c: float | None


class NvmlGpu:
    """A GPU by NVML index, with its capabilities probed once at open."""

    power_sources = ("nvml_average", "nvml_instant")  # source labels of its power series

    def __init__(self, nvml: ModuleType | Any, index: int):
        self.nvml = nvml
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.name = _text(nvml.nvmlDeviceGetName(self.handle))
        self.uuid = _text(nvml.nvmlDeviceGetUUID(self.handle))
        self.has_energy_counter = self._probe(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        self.has_instant_power = self._probe_instant()
        self.has_power_limit = self._probe(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle))

    @property
    def label(self) -> str:
        return str(self.index)

    def _probe(self, call) -> bool:
        try:
            call()
        except self.nvml.NVMLError as exc:
            log.info("GPU %d (%s): %s", self.index, self.name, exc)
            return False
        return True

    def _probe_instant(self) -> bool:
        try:
            return self.read_instant_power_w() is not None
        except self.nvml.NVMLError:
            return False

    # --- cheap reads used by the energy meter ---
    def read_energy_mj(self) -> int:
        """The GPU's own energy counter, millijoules since the driver loaded (Volta+)."""
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def read_instant_power_w(self) -> float | None:
        """NVML_FI_DEV_POWER_INSTANT in watts, or None where the driver lacks the field."""
        nvml = self.nvml
        (value,) = nvml.nvmlDeviceGetFieldValues(self.handle, [nvml.NVML_FI_DEV_POWER_INSTANT])
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            return None
        field = _VALUE_FIELDS.get(int(value.valueType))
        if field is None:
            return None
        return float(getattr(value.value, field)) / 1000.0  # milliwatts

    def read_average_power_w(self) -> float:
        """nvmlDeviceGetPowerUsage in watts (a 1 s average on Ampere and newer except GA100)."""
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0

    def read_power_w(self) -> float:
        """The most instantaneous power this GPU offers, for integrating energy."""
        if self.has_instant_power:
            instant = self.read_instant_power_w()
            if instant is not None:
                return instant
        return self.read_average_power_w()

    # --- the full sample for the exporter ---
    def _optional(self, call: Callable[[], Any]) -> Any:
        """``call()``, or None where the GPU does not support it; other errors propagate."""
        try:
            return call()
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self.nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise

    def status(self) -> GpuStatus:
        """Every gauge reading. Raises NVMLError when the GPU fails (lost, driver gone)."""
        nvml, h, opt = self.nvml, self.handle, self._optional
        util = opt(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        mem = opt(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        limit = opt(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h)) if self.has_power_limit else None
        clock = opt(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        temperature = opt(lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
        return GpuStatus(
            power_average_w=opt(self.read_average_power_w),
            power_instant_w=self.read_instant_power_w() if self.has_instant_power else None,
            power_limit_w=None if limit is None else limit / 1000.0,
            utilization=None if util is None else util.gpu / 100.0,
            memory_utilization=None if util is None else util.memory / 100.0,
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            sm_clock_hz=None if clock is None else clock * 1e6,
            temperature_c=None if temperature is None else float(temperature),
        )


@dataclass
class NvmlOpenResult:
    gpus: list[NvmlGpu]
    reason: str | None  # why there are no GPUs, when there are none


def open_gpus(
    nvml: ModuleType | Any | None, indices: list[int] | None, gpu_type: type[NvmlGpu] = NvmlGpu
) -> NvmlOpenResult:
    """Initialise NVML and open the GPUs named (all when ``indices`` is None) as ``gpu_type``.

    Never raises: a machine without NVML simply gets no GPUs and a reason.
    """
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError as exc:  # pragma: no cover - it is a dependency
            return NvmlOpenResult([], f"nvidia-ml-py not importable: {exc}")
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return NvmlOpenResult([], f"nvmlInit failed: {type(exc).__name__}: {exc}")
    try:
        count = nvml.nvmlDeviceGetCount()
        wanted = list(range(count)) if indices is None else list(indices)
        missing = [i for i in wanted if not 0 <= i < count]
        if missing:
            log.warning("GPUs %s requested but NVML sees %d GPU(s); skipping them", missing, count)
        gpus = [gpu_type(nvml, i) for i in wanted if 0 <= i < count]
    except nvml.NVMLError as exc:
        _shutdown(nvml)
        return NvmlOpenResult([], f"NVML device query failed: {type(exc).__name__}: {exc}")
    if not gpus:
        _shutdown(nvml)
        return NvmlOpenResult([], f"NVML sees {count} GPU(s), none of them selected")
    return NvmlOpenResult(gpus, None)


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as exc:
        log.debug("nvmlShutdown: %s", exc)

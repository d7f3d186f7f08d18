"""NVML and RAPL energy telemetry: sampler thread, per-batch energy meter, Prometheus metrics."""

from telemetry.energy import BatchEnergy, EnergyMeter
from telemetry.service import TelemetryService

__all__ = ["BatchEnergy", "EnergyMeter", "TelemetryService"]

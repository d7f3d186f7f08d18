"""A powercap (RAPL) tree written by hand, as sysfs lays it out: the CPU package energy
counters the telemetry reads, for the tests that drive them."""

from __future__ import annotations

from pathlib import Path

MAX_RANGE = 262_143_328_850  # a typical package max_energy_range_uj


def make_zone(root: Path, zone: str, name: str, energy_uj: int, max_range: int = MAX_RANGE) -> Path:
    path = root / zone
    path.mkdir(parents=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_range}\n")
    return path


def set_energy(zone: Path, energy_uj: int) -> None:
    """Replace the value atomically, as sysfs does (a reader never sees a half-written file)."""
    scratch = zone / "energy_uj.new"
    scratch.write_text(f"{energy_uj}\n")
    scratch.replace(zone / "energy_uj")

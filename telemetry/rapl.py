"""CPU package energy from Linux powercap (RAPL): ``intel-rapl:N/energy_uj``.

The counter is in microjoules and wraps at ``max_energy_range_uj``; reading it often enough
(the sampler does, every interval) lets us unwrap it into a monotonic joule count. Since 2020
kernels make ``energy_uj`` root-only, so "readable" is checked by reading, not by existence.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")  # packages; subzones are intel-rapl:N:M


@dataclass(frozen=True)
class RaplDomain:
    """One package zone: its sysfs folder, its name (e.g. package-0) and its wrap range."""

    path: Path
    name: str
    max_energy_range_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


def find_packages(root: Path) -> tuple[list[RaplDomain], str | None]:
    """Readable package zones under ``root`` (e.g. /sys/class/powercap), or a reason why none."""
    if not root.is_dir():
        return [], f"{root} does not exist"
    domains: list[RaplDomain] = []
    problems: list[str] = []
    for zone in sorted(p for p in root.iterdir() if _PACKAGE_ZONE.match(p.name)):
        try:
            name = (zone / "name").read_text().strip() if (zone / "name").exists() else zone.name
            max_range = int((zone / "max_energy_range_uj").read_text().strip())
            domain = RaplDomain(zone, name, max_range)
            domain.read_uj()
        except (OSError, ValueError) as exc:
            problems.append(f"{zone.name}: {type(exc).__name__}: {exc}")
            continue
        if max_range <= 0:
            problems.append(f"{zone.name}: max_energy_range_uj={max_range}")
            continue
        domains.append(domain)
    if domains:
        return domains, None
    if problems:
        return [], "no readable RAPL package zone (" + "; ".join(problems) + ")"
    return [], f"no intel-rapl:N zone under {root}"


def unwrap_delta_uj(previous: int, current: int, max_range_uj: int) -> int:
    """Energy between two reads of a counter that wraps to 0 after ``max_range_uj``."""
    if current >= previous:
        return current - previous
    return max_range_uj - previous + current

#!/usr/bin/env python3
"""What one energy-meter read costs, on this machine.

The meter reads every metered device at batch begin and end, on the engine thread, so its
cost is added to every batch. This measures, side by side:

- ``meter_fake_nvml``: EnergyMeter.begin()+end() over the FakeNvml TEST DOUBLE -- wattserve's
  own Python overhead (ledger lock, bookkeeping), without any driver call;
- ``rapl_tmpfs``: one RAPL ``energy_uj`` read from a file tree in a temp folder (a stand-in
  for sysfs, which is usually faster to reach but root-only);
- ``meter_real_nvml``: begin()+end() with the real NVML, only where a GPU is present.

Run: ``python -m benchmarks.telemetry_read_cost [--reads 20000] [--out results/telemetry_read_cost.json]``
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wattserve.telemetry.cumulative import CounterEnergy, RaplEnergy  # noqa: E402
from wattserve.telemetry.energy import EnergyLedger, EnergyMeter  # noqa: E402
from wattserve.telemetry.nvml_gpu import open_gpus  # noqa: E402
from wattserve.telemetry.rapl import find_packages  # noqa: E402


def timed(call: Callable[[], object], reads: int) -> dict[str, float]:
    for _ in range(min(1000, reads)):
        call()
    durations = []
    for _ in range(reads):
        t0 = time.perf_counter()
        call()
        durations.append(time.perf_counter() - t0)
    durations.sort()
    return {
        "reads": reads,
        "mean_us": statistics.fmean(durations) * 1e6,
        "p50_us": durations[len(durations) // 2] * 1e6,
        "p99_us": durations[int(len(durations) * 0.99)] * 1e6,
    }


def begin_end(meter: EnergyMeter) -> Callable[[], object]:
    return lambda: meter.end(meter.begin())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "telemetry_read_cost.json")
    args = parser.parse_args()
    results: dict[str, object] = {"host": platform.node(), "python": sys.version.split()[0]}

    from support.doubles.fake_nvml import FakeGpu, FakeNvml  # the test double, named as such

    fake = FakeNvml([FakeGpu()])
    meter = EnergyMeter(EnergyLedger([CounterEnergy(g) for g in open_gpus(fake, None).gpus]))
    results["meter_fake_nvml"] = timed(begin_end(meter), args.reads)

    with tempfile.TemporaryDirectory() as tmp:
        zone = Path(tmp) / "intel-rapl:0"
        zone.mkdir()
        (zone / "name").write_text("package-0\n")
        (zone / "energy_uj").write_text("123456789\n")
        (zone / "max_energy_range_uj").write_text("262143328850\n")
        (domain,), _ = find_packages(Path(tmp))
        results["rapl_tmpfs"] = timed(RaplEnergy(domain).read_joules, args.reads)

    real = open_gpus(None, None)
    if real.gpus:
        energies = [CounterEnergy(g) for g in real.gpus if g.has_energy_counter]
        if energies:
            real_meter = EnergyMeter(EnergyLedger(energies))
            results["meter_real_nvml"] = timed(begin_end(real_meter), args.reads)
    else:
        results["meter_real_nvml"] = f"not measured: {real.reason}"

    for name, value in results.items():
        if isinstance(value, dict):
            print(f"{name:18s} mean {value['mean_us']:7.2f} us  p50 {value['p50_us']:7.2f} us  "
                  f"p99 {value['p99_us']:7.2f} us  ({value['reads']} reads)")  # fmt: skip
        else:
            print(f"{name:18s} {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""GPU energy check for a lent GPU: is the counter right, and what does an inference cost?

Runs torchvision ResNet50 (random weights; nothing is downloaded) on CUDA under load for about
a minute and reports, side by side over the same windows:

- energy from the GPU's own counter (nvmlDeviceGetTotalEnergyConsumption),
- energy from integrating the sampled average power (nvmlDeviceGetPowerUsage),
- energy from integrating the sampled instantaneous power (NVML_FI_DEV_POWER_INSTANT),
- joules per inference at two or three batch sizes (counter over the window, the sum of
  wattserve's per-batch EnergyMeter figures, and TelemetryService.window_report),
- idle power before the load, and the cost of one NVML read of each kind.

It prints a table and writes JSON (``--out``). Without CUDA or NVML it stops at once with
exit status 2 and says what is missing. Usage:

    python scripts/gpu_energy_check.py --out gpu_energy.json [--batch-sizes 1,8,32]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EXIT_NO_GPU = 2


# ---------------------------------------------------------------- pure helpers (tested)
@dataclass(frozen=True)
class PowerSample:
    t: float  # monotonic seconds
    average_w: float  # nvmlDeviceGetPowerUsage
    instant_w: float | None  # NVML_FI_DEV_POWER_INSTANT, None where the driver lacks it
    counter_mj: int | None  # nvmlDeviceGetTotalEnergyConsumption, None without a counter


def parse_batch_sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.replace(" ", "").split(",") if part]
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers: {text!r}")
    return sizes


def trapezoid_joules(points: Sequence[tuple[float, float]]) -> float:
    """Energy from (seconds, watts) points by the trapezoid rule."""
    return sum(0.5 * (w0 + w1) * (t1 - t0) for (t0, w0), (t1, w1) in itertools.pairwise(points))


def window(samples: Sequence[PowerSample], t0: float, t1: float) -> list[PowerSample]:
    return [s for s in samples if t0 <= s.t <= t1]


def compare_energy(samples: Sequence[PowerSample]) -> dict[str, float | None]:
    """Counter vs integrated average vs integrated instant power, over the samples' own span."""
    if len(samples) < 2:
        raise ValueError("need at least two power samples in the window")
    span = samples[-1].t - samples[0].t
    counter = (
        (samples[-1].counter_mj - samples[0].counter_mj) / 1000.0  # type: ignore[operator]
        if samples[0].counter_mj is not None and samples[-1].counter_mj is not None
        else None
    )
    average = trapezoid_joules([(s.t, s.average_w) for s in samples])
    instants = [(s.t, s.instant_w) for s in samples if s.instant_w is not None]
    instant = trapezoid_joules(instants) if len(instants) == len(samples) else None
    return {
        "span_s": span,
        "counter_j": counter,
        "average_power_integrated_j": average,
        "instant_power_integrated_j": instant,
        "average_power_vs_counter": relative_difference(average, counter),
        "instant_power_vs_counter": relative_difference(instant, counter),
        "mean_power_w": (counter if counter is not None else average) / span if span > 0 else None,
    }


def relative_difference(value: float | None, reference: float | None) -> float | None:
    """(value - reference) / reference, or None when either is missing or the reference is 0."""
    if value is None or reference is None or reference == 0:
        return None
    return (value - reference) / reference


def match_nvml_index(cuda_uuid: str | None, nvml_uuids: Sequence[str], cuda_index: int) -> int:
    """The NVML index of a CUDA device: by UUID (orders can differ), else the same index."""
    if cuda_uuid:
        wanted = cuda_uuid.lower().removeprefix("gpu-")
        for index, uuid in enumerate(nvml_uuids):
            if uuid.lower().removeprefix("gpu-") == wanted:
                return index
    return cuda_index


def percentiles_us(durations_s: Sequence[float]) -> dict[str, float]:
    ordered = sorted(durations_s)
    return {
        "mean_us": statistics.fmean(ordered) * 1e6,
        "p50_us": ordered[len(ordered) // 2] * 1e6,
        "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6,
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 else f"{value:.{digits}f}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A plain-text table; ``columns`` are (key, heading)."""
    cells = [[heading for _, heading in columns]]
    cells += [[_fmt(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


RUN_COLUMNS = (
    ("batch_size", "batch"),
    ("inferences", "inferences"),
    ("throughput_per_s", "img/s"),
    ("mean_power_w", "mean W"),
    ("counter_j", "counter J"),
    ("average_power_integrated_j", "avg-power J"),
    ("instant_power_integrated_j", "instant J"),
    ("average_power_vs_counter", "avg vs ctr"),
    ("instant_power_vs_counter", "inst vs ctr"),
    ("joules_per_inference", "J/inf ctr"),
    ("meter_joules_per_inference", "J/inf meter"),
    ("service_joules_per_inference", "J/inf window"),
)


# ---------------------------------------------------------------- the GPU side (not run here)
def require_cuda() -> Any:
    """torch with CUDA, or exit 2 with a message saying what is missing."""
    try:
        import torch
    except ImportError as exc:
        fail(f"torch is not importable ({exc}); this check needs torch with CUDA")
    if not torch.cuda.is_available():
        fail(
            "CUDA is not available (torch.cuda.is_available() is False): this check needs an "
            "NVIDIA GPU; run it on a machine with one (see docs/telemetry.md)"
        )
    return torch


def fail(message: str) -> None:
    print(f"gpu_energy_check: {message}", file=sys.stderr)
    raise SystemExit(EXIT_NO_GPU)


class PowerSampler:
    """Samples average power, instant power and the counter of one GPU in its own thread."""

    def __init__(self, gpu: Any, interval_s: float):
        self.gpu = gpu
        self.interval_s = interval_s
        self.samples: list[PowerSample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)

    def _run(self) -> None:
        gpu = self.gpu
        while not self._stop.is_set():
            try:
                sample = PowerSample(
                    t=time.monotonic(),
                    average_w=gpu.read_average_power_w(),
                    instant_w=gpu.read_instant_power_w() if gpu.has_instant_power else None,
                    counter_mj=gpu.read_energy_mj() if gpu.has_energy_counter else None,
                )
            except gpu.nvml.NVMLError as exc:  # keep sampling; the gap shows in the span
                self.errors.append(str(exc))
            else:
                self.samples.append(sample)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PowerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def nvml_read_costs(gpu: Any, reads: int) -> dict[str, dict[str, float]]:
    calls = {"power_usage": gpu.read_average_power_w}
    if gpu.has_energy_counter:
        calls["energy_counter"] = gpu.read_energy_mj
    if gpu.has_instant_power:
        calls["instant_power_field"] = gpu.read_instant_power_w
    costs = {}
    for name, call in calls.items():
        durations = []
        for _ in range(reads):
            t0 = time.perf_counter()
            call()
            durations.append(time.perf_counter() - t0)
        costs[name] = percentiles_us(durations)
    return costs


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    torch = require_cuda()
    import torchvision
    from prometheus_client import CollectorRegistry
    from wattserve.telemetry.nvml_gpu import open_gpus
    from wattserve.telemetry.service import TelemetryConfig, TelemetryService

    device = torch.device(f"cuda:{args.cuda_device}")
    props = torch.cuda.get_device_properties(device)
    opened = open_gpus(None, None)
    if not opened.gpus:
        fail(f"NVML is not usable: {opened.reason}")
    nvml_index = match_nvml_index(
        str(getattr(props, "uuid", "")) or None, [g.uuid for g in opened.gpus], args.cuda_device
    )
    gpu = opened.gpus[nvml_index]
    import pynvml

    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": gpu.name,
        "nvml_index": nvml_index,
        "cuda_device": args.cuda_device,
        "driver": str(pynvml.nvmlSystemGetDriverVersion()),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "energy_counter": gpu.has_energy_counter,
        "instant_power_field": gpu.has_instant_power,
        "sample_interval_ms": args.sample_interval_ms,
        "precision": "fp16" if args.fp16 else "fp32",
        "nvml_read_cost": nvml_read_costs(gpu, args.cost_reads),
    }
    print(f"{gpu.name} (NVML {nvml_index}, cuda:{args.cuda_device}), driver {report['driver']}")
    print(f"energy counter: {gpu.has_energy_counter}, instant power: {gpu.has_instant_power}")
    for name, cost in report["nvml_read_cost"].items():
        print(f"NVML {name} read: mean {cost['mean_us']:.1f} us, p99 {cost['p99_us']:.1f} us")

    interval = args.sample_interval_ms / 1000.0
    torch.cuda.synchronize(device)
    with PowerSampler(gpu, interval) as sampler:
        t0 = time.monotonic()
        time.sleep(args.idle_seconds)
        idle = compare_energy(window(sampler.samples, t0, time.monotonic()))
    report["idle"] = idle
    print(f"idle: {_fmt(idle['mean_power_w'])} W over {idle['span_s']:.1f} s")

    model = torchvision.models.resnet50(weights=None).eval().to(device)
    dtype = torch.float16 if args.fp16 else torch.float32
    model = model.to(dtype=dtype, memory_format=torch.channels_last)

    config = TelemetryConfig(
        telemetry=True,
        telemetry_interval_ms=100.0,
        gpus=[nvml_index],
        rapl_root=Path("/sys/class/powercap"),
    )
    service = TelemetryService(config, CollectorRegistry())
    service.start()
    report["service"] = service.describe()
    print(f"wattserve telemetry: {report['service']}")
    meter = service.meter_for(str(device))  # that GPU's counter only
    runs = []
    try:
        for size in args.batch_sizes:
            runs.append(run_size(torch, model, device, dtype, size, args, gpu, interval, service, meter))
            last = runs[-1]
            print(
                f"batch {size}: {last['throughput_per_s']:.1f} img/s, "
                f"{_fmt(last['mean_power_w'])} W, {_fmt(last['joules_per_inference'])} J/inference"
            )
    finally:
        service.stop()
    report["runs"] = runs
    return report


def run_size(
    torch: Any,
    model: Any,
    device: Any,
    dtype: Any,
    size: int,
    args: argparse.Namespace,
    gpu: Any,
    interval: float,
    service: Any,
    meter: Any,
    item_shape: tuple[int, ...] = (3, 224, 224),
) -> dict[str, Any]:
    """One batch size under load for ``args.seconds_per_size``; all energy views of it.

    Device-agnostic so the tests can drive it on CPU with the FakeNvml double.
    """
    on_cuda = torch.device(device).type == "cuda"
    host = torch.randn(size, *item_shape).to(dtype=dtype)
    if on_cuda:
        host = host.pin_memory()
    with torch.inference_mode():
        for _ in range(args.warmup):
            model(host.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last))
        if on_cuda:
            torch.cuda.synchronize(device)
        spans: list[Any] = []
        batches = 0
        with PowerSampler(gpu, interval) as sampler:
            time.sleep(2 * interval)
            t0, wall0 = time.monotonic(), time.time()
            while time.monotonic() - t0 < args.seconds_per_size:
                mark = meter.begin() if meter is not None else None
                x = host.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
                model(x).float().cpu().numpy()  # like an engine: numpy out, so CUDA is done
                energy = meter.end(mark) if meter is not None else None
                service.record_batch("resnet50", "gpu_energy_check", size, energy)
                batches += 1
                if energy is not None:
                    spans.append(energy)
            t1, wall1 = time.monotonic(), time.time()
            time.sleep(2 * interval)
        inside = window(sampler.samples, t0, t1)
    # a batch's figure is final once the counter stepped after it ended (the poller sees it)
    final = [s for s in spans if s.wait(timeout=2.0) and s.attributed_joules is not None]
    meter_joules, meter_batches = sum(s.attributed_joules for s in final), len(final)
    row: dict[str, Any] = {"batch_size": size, "batches": batches, "inferences": batches * size}
    row.update(compare_energy(inside))
    duration = t1 - t0
    row["duration_s"] = duration
    row["throughput_per_s"] = batches * size / duration
    # scale the counter's span energy to the exact window for the per-inference figure
    energy = row["counter_j"] if row["counter_j"] is not None else row["average_power_integrated_j"]
    row["joules_per_inference"] = energy / row["span_s"] * duration / row["inferences"]
    row["meter_joules_per_inference"] = meter_joules / (meter_batches * size) if meter_batches else None
    window_report = service.window_report(wall0, wall1)
    row["service_window"] = window_report
    row["service_joules_per_inference"] = window_report["joules_per_inference"]
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_energy.json"))
    parser.add_argument("--cuda-device", type=int, default=0)
    parser.add_argument("--batch-sizes", type=parse_batch_sizes, default=[1, 8, 32])
    parser.add_argument("--seconds-per-size", type=float, default=15.0)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=int, default=10, help="batches before measuring")
    parser.add_argument("--sample-interval-ms", type=float, default=20.0)
    parser.add_argument("--cost-reads", type=int, default=1000)
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args(argv)
    report = run_check(args)
    print()
    print(format_table(report["runs"], RUN_COLUMNS))
    args.out.write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    print(f"\nwrote {args.out}")
    return 0


def _json_default(value: Any) -> Any:
    if isinstance(value, PowerSample):
        return asdict(value)
    return str(value)


if __name__ == "__main__":
    raise SystemExit(main())

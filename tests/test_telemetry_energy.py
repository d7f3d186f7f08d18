"""Energy meter, ledger and window arithmetic, against the FakeNvml test double.

These use a counter that follows every read (update_period_s=0), so each read closes a window
and figures are exact; tests/test_telemetry_attribution.py runs the stepwise counter."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry
from wattserve.server.settings import Settings
from wattserve.telemetry import EnergyMeter, TelemetryService
from wattserve.telemetry.cumulative import CounterEnergy, IntegratedPowerEnergy
from wattserve.telemetry.energy import EnergyLedger
from wattserve.telemetry.nvml_gpu import open_gpus
from wattserve.telemetry.windows import union_length

from support.doubles.fake_nvml import NVML_ERROR_GPU_IS_LOST, FakeGpu, FakeNvml


def meter_for(fake: FakeNvml) -> EnergyMeter:
    gpus = open_gpus(fake, None).gpus
    energies = [
        CounterEnergy(g) if g.has_energy_counter else IntegratedPowerEnergy.for_gpu(g, fake.clock)
        for g in gpus
    ]
    return EnergyMeter(EnergyLedger(energies, fake.clock))


def test_counter_delta_is_the_batch_energy():
    fake = FakeNvml([FakeGpu(power_w=250.0)])
    meter = meter_for(fake)
    mark = meter.begin()
    fake.advance(0.4)  # 250 W * 0.4 s = 100 J
    energy = meter.end(mark)
    assert energy.final and energy.attributed_joules == pytest.approx(100.0)
    assert energy.source == "nvml_counter"
    assert not hasattr(energy, "joules")  # nothing to put in a response header
    # the counter, not power: one energy call per GPU per read, no power calls
    assert fake.gpus[0].calls.get("power_usage", 0) == 0


def test_counter_ignores_power_readings():
    """With a counter, changing what power reads must not change the energy."""
    fake = FakeNvml([FakeGpu(power_w=100.0, average_power_w=999.0)])
    meter = meter_for(fake)
    mark = meter.begin()
    fake.advance(1.0)
    assert meter.end(mark).attributed_joules == pytest.approx(100.0)


def test_counter_absent_integrates_power_trapezoid():
    fake = FakeNvml([FakeGpu(power_w=100.0, has_energy_counter=False)])
    meter = meter_for(fake)
    assert meter.source == "nvml_power_integrated"
    mark = meter.begin()  # 100 W at t=0
    fake.advance(1.0)
    fake.gpus[0].power_w = 300.0
    meter.ledger.tick()  # a sampler read at t=1, 300 W: (100+300)/2 * 1 = 200 J
    fake.advance(1.0)
    energy = meter.end(mark)  # 300 W at t=2: + (300+300)/2 * 1 = 300 J
    assert energy.attributed_joules == pytest.approx(500.0)
    assert energy.source == "nvml_power_integrated"


def test_integration_prefers_instant_power_over_the_average():
    fake = FakeNvml([FakeGpu(power_w=200.0, average_power_w=50.0, has_energy_counter=False)])
    meter = meter_for(fake)
    mark = meter.begin()
    fake.advance(2.0)
    assert meter.end(mark).attributed_joules == pytest.approx(400.0)  # 200 W instant, not 50 W average


def test_integration_falls_back_to_power_usage_without_the_instant_field():
    fake = FakeNvml(
        [
            FakeGpu(
                power_w=200.0,
                average_power_w=50.0,
                has_energy_counter=False,
                has_instant_power=False,
            )
        ]
    )
    meter = meter_for(fake)
    mark = meter.begin()
    fake.advance(2.0)
    assert meter.end(mark).attributed_joules == pytest.approx(100.0)


def test_several_gpus_are_summed():
    fake = FakeNvml([FakeGpu(power_w=100.0, uuid="a"), FakeGpu(power_w=300.0, uuid="b")])
    meter = meter_for(fake)
    assert meter.devices == ["gpu0", "gpu1"]
    mark = meter.begin()
    fake.advance(0.5)
    energy = meter.end(mark)
    assert energy.attributed_joules == pytest.approx(200.0) and energy.source == "nvml_counter"
    assert energy.share("gpu0") == pytest.approx(50.0) and energy.share("gpu1") == pytest.approx(150.0)


def test_mixed_gpus_are_labelled_with_the_weaker_source():
    fake = FakeNvml([FakeGpu(power_w=100.0), FakeGpu(power_w=300.0, has_energy_counter=False)])
    meter = meter_for(fake)
    mark = meter.begin()
    fake.advance(1.0)
    energy = meter.end(mark)
    assert energy.attributed_joules == pytest.approx(400.0) and energy.source == "nvml_power_integrated"


def test_a_gpu_error_gives_no_figure_and_keeps_the_books_balanced():
    fake = FakeNvml([FakeGpu(power_w=100.0), FakeGpu(power_w=100.0)])
    meter = meter_for(fake)
    mark = meter.begin()
    fake.gpus[1].failing = NVML_ERROR_GPU_IS_LOST
    fake.advance(1.0)
    energy = meter.end(mark)
    assert energy.final and energy.attributed_joules is None  # never a partial sum
    fake.gpus[1].failing = None
    fake.advance(1.0)
    meter.ledger.tick()
    # No batch is active any more: the last second (and gpu1's whole gap) is idle.
    books = {a.device: a for a in meter.ledger.snapshot()}
    assert books["gpu1"].busy == 0.0 and books["gpu1"].idle == pytest.approx(200.0)
    assert books["gpu0"].busy == pytest.approx(100.0)
    assert books["gpu0"].idle == pytest.approx(100.0)
    assert books["gpu1"].ok


def test_end_twice_is_refused():
    meter = meter_for(FakeNvml())
    mark = meter.begin()
    meter.end(mark)
    with pytest.raises(RuntimeError):
        meter.end(mark)
    with pytest.raises(TypeError):
        meter.end(object())


def test_busy_and_idle_split_overlapping_batches_without_double_counting():
    """Two engine instances overlap: a window they share is split by their busy time."""
    fake = FakeNvml([FakeGpu(power_w=100.0)])
    meter = meter_for(fake)
    meter.ledger.tick()
    fake.advance(1.0)  # idle 100 J
    a = meter.begin()
    fake.advance(1.0)  # busy (a) 100 J
    b = meter.begin()
    fake.advance(1.0)  # busy (a and b) 100 J
    ea = meter.end(a)
    fake.advance(1.0)  # busy (b) 100 J
    eb = meter.end(b)
    fake.advance(2.0)  # idle 200 J
    meter.ledger.tick()
    (account,) = meter.ledger.snapshot()
    assert account.busy == pytest.approx(300.0)
    assert account.idle == pytest.approx(300.0)
    # a: 100 J alone + half of the shared 100 J; b likewise: they sum to busy, nothing twice
    assert ea.attributed_joules == pytest.approx(150.0) and eb.attributed_joules == pytest.approx(150.0)


def test_counter_restart_is_not_negative_energy():
    fake = FakeNvml([FakeGpu(power_w=100.0)])
    meter = meter_for(fake)
    mark = meter.begin()
    fake.advance(1.0)
    fake.gpus[0].energy_mj = 0.0  # driver reloaded
    fake.advance(0.5)
    energy = meter.end(mark)
    assert energy.attributed_joules == pytest.approx(50.0)  # only what the restarted counter shows


def test_meter_is_safe_from_many_threads():
    fake = FakeNvml([FakeGpu(power_w=100.0)])
    meter = meter_for(fake)
    errors: list[BaseException] = []
    spans = []

    def work():
        try:
            for _ in range(200):
                mark = meter.begin()
                fake.advance(0.001)
                spans.append(meter.end(mark))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    meter.ledger.tick()
    (account,) = meter.ledger.snapshot()
    assert account.busy + account.idle == pytest.approx(800 * 0.001 * 100.0, rel=1e-6, abs=0.01)
    assert all(s.final for s in spans)
    assert sum(s.attributed_joules for s in spans) == pytest.approx(account.busy)


def test_union_length_counts_overlaps_once():
    assert union_length([]) == 0.0
    assert union_length([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.2, 3.5)]) == pytest.approx(3.0)


def _service(fake: FakeNvml, **overrides) -> tuple[TelemetryService, CollectorRegistry]:
    registry = CollectorRegistry()
    settings = Settings(telemetry_interval_ms=3_600_000, rapl_root="/nonexistent", **overrides)
    service = TelemetryService(
        settings.telemetry_config(), registry, nvml=fake, clock=fake.clock, sleep=fake.sleep
    )
    return service, registry


def test_record_batch_shares_energy_equally_per_request():
    fake = FakeNvml([FakeGpu(power_w=200.0)])
    service, registry = _service(fake)
    service.start()
    try:
        meter = service.meter
        assert meter is not None and service.available and service.gpu_available
        mark = meter.begin()
        fake.advance(0.5)  # 100 J for a batch of 4: 25 J each
        energy = meter.end(mark)
        service.record_batch("resnet50", "dynamic", 4, energy)
        assert energy.final  # the counter follows every read here: the end read closed it
        labels = {"model": "resnet50", "batcher": "dynamic", "source": "nvml_counter"}
        get = registry.get_sample_value
        assert get("wattserve_energy_batch_joules_count", labels) == 1
        assert get("wattserve_energy_batch_joules_sum", labels) == pytest.approx(100.0)
        assert get("wattserve_energy_inference_joules_count", labels) == 4
        assert get("wattserve_energy_inference_joules_sum", labels) == pytest.approx(100.0)
        # 25 J each: all four in the (20, 50] bucket
        assert get("wattserve_energy_inference_joules_bucket", {**labels, "le": "20.0"}) == 0
        assert get("wattserve_energy_inference_joules_bucket", {**labels, "le": "50.0"}) == 4
        # an unmeasured batch counts nothing in the energy histograms
        service.record_batch("resnet50", "dynamic", 2, None)
        assert get("wattserve_energy_inference_joules_count", labels) == 4
    finally:
        service.stop()
    assert fake.shutdowns == 1


def test_observe_many_matches_one_by_one_observations():
    from prometheus_client import Histogram
    from wattserve.telemetry.service import observe_many

    registry = CollectorRegistry()
    buckets = (0.1, 1.0, 10.0)
    fast = Histogram("fast", "", ("k",), buckets=buckets, registry=registry).labels("x")
    slow = Histogram("slow", "", ("k",), buckets=buckets, registry=registry).labels("x")
    for value, count in ((0.05, 3), (1.0, 2), (5.0, 7), (50.0, 4)):
        observe_many(fast, value, count)
        for _ in range(count):
            slow.observe(value)
    get = registry.get_sample_value
    for le in ("0.1", "1.0", "10.0", "+Inf"):
        assert get("fast_bucket", {"k": "x", "le": le}) == get("slow_bucket", {"k": "x", "le": le})
    assert get("fast_count", {"k": "x"}) == get("slow_count", {"k": "x"}) == 16
    assert get("fast_sum", {"k": "x"}) == pytest.approx(get("slow_sum", {"k": "x"}))


def test_settings_select_gpus():
    fake = FakeNvml([FakeGpu(uuid="a"), FakeGpu(uuid="b"), FakeGpu(uuid="c")])
    service, registry = _service(fake, gpus=[2, 7])
    service.start()
    try:
        assert [g.index for g in service.gpus] == [2]
        assert service.meter.devices == ["gpu2"]
        assert (
            registry.get_sample_value(
                "wattserve_gpu_info", {"gpu": "2", "name": fake.gpus[2].name, "uuid": "c"}
            )
            == 1
        )
        assert registry.get_sample_value("wattserve_gpu_stale", {"gpu": "0"}) is None
    finally:
        service.stop()

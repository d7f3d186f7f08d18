"""Window attribution against a GPU that behaves like one (the stepwise FakeNvml double).

The double's counter steps every ``update_period_s`` (Hopper: ~20-100 ms) in ``quantum_mj``
units while a batch takes ~1 ms, its power is higher while a kernel runs, and it keeps the
true busy/idle energy as ground truth. Each run is 5 s of simulated time, driven event by
event: Poisson batch arrivals, the energy poller's reads, batch begin/end reads, exactly as
the server's threads would interleave them (the simulated clock makes it deterministic).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry
from wattserve.server.settings import Settings
from wattserve.telemetry import TelemetryService

from support.doubles.fake_nvml import FakeGpu, FakeNvml

IDLE_W, BUSY_W = 90.0, 450.0


@dataclass
class Run:
    fake: FakeNvml
    service: TelemetryService
    registry: CollectorRegistry
    spans: list = field(default_factory=list)  # (span, size, model)
    counter0_mj: int = 0
    counter1_mj: int = 0
    books0: tuple[float, float] = (0.0, 0.0)
    books1: tuple[float, float] = (0.0, 0.0)
    truth0: tuple[float, float] = (0.0, 0.0)
    truth1: tuple[float, float] = (0.0, 0.0)

    @property
    def gpu(self) -> FakeGpu:
        return self.fake.gpus[0]

    def books(self) -> tuple[float, float]:
        (account,) = [a for a in self.service._ledger.snapshot() if a.device == "gpu0"]
        return account.busy, account.idle

    @property
    def busy(self) -> float:
        return self.books1[0] - self.books0[0]

    @property
    def idle(self) -> float:
        return self.books1[1] - self.books0[1]

    @property
    def true_busy(self) -> float:
        return self.truth1[0] - self.truth0[0]

    @property
    def counter_delta_j(self) -> float:
        return (self.counter1_mj - self.counter0_mj) / 1000.0


def start_service(fake: FakeNvml, rapl_root="/nonexistent") -> tuple[TelemetryService, CollectorRegistry]:
    registry = CollectorRegistry()
    settings = Settings(telemetry_interval_ms=3_600_000, rapl_root=rapl_root)
    service = TelemetryService(
        settings.telemetry_config(), registry, nvml=fake, clock=fake.clock, sleep=fake.sleep, background=False
    )
    service.start()
    return service, registry


def wait_for_step(run: Run) -> None:
    """Poll until the counter steps, so the books are read at a window edge."""
    before = run.gpu.counter_reading_mj()
    while run.gpu.counter_reading_mj() == before:
        run.fake.advance(run.service.poll_s)
        run.service.poll_once()


def simulate(
    rate_hz: float,
    *,
    seconds: float = 5.0,
    period_s: float = 0.05,
    quantum_mj: float = 1.0,
    instances: int = 1,
    models: tuple[tuple[str, float], ...] = (("m", 0.001),),  # (name, seconds per item)
    seed: int = 1,
) -> Run:
    """Poisson batches for ``seconds``; each model's batch takes size * its per-item time."""
    gpu = FakeGpu(
        power_w=IDLE_W, busy_power_w=BUSY_W, update_period_s=period_s, quantum_mj=quantum_mj,
        update_phase_s=0.0123,
    )  # fmt: skip
    fake = FakeNvml([gpu])
    service, registry = start_service(fake)
    meter = service.meter_for("cuda:0")
    assert meter is not None and meter.devices == ["gpu0"]
    run = Run(fake, service, registry)
    rng = random.Random(seed)

    wait_for_step(run)
    run.counter0_mj, run.books0 = gpu.counter_reading_mj(), run.books()
    run.truth0 = (gpu.true_busy_j, gpu.true_idle_j)
    t_end = fake.now + seconds
    free_at = [fake.now] * instances  # when each engine instance is free
    events: list[tuple[float, int, str, object]] = []  # (time, seq, kind, payload)
    seq = 0

    def push(t: float, kind: str, payload: object = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    push(fake.now + rng.expovariate(rate_hz), "arrive")
    push(fake.now + service.poll_s, "poll")
    while events:
        t, _, kind, payload = heapq.heappop(events)
        if t > fake.now:
            fake.advance(t - fake.now)
        if kind == "poll":
            service.poll_once()
            if fake.now < t_end + 4 * period_s:
                push(fake.now + service.poll_s, "poll")
        elif kind == "arrive":
            i = min(range(instances), key=lambda k: free_at[k])
            start = max(fake.now, free_at[i])
            name, per_item = models[rng.randrange(len(models))]
            size = rng.randint(1, 8)
            free_at[i] = start + size * per_item
            push(start, "begin", (name, size, per_item, i))
            nxt = fake.now + rng.expovariate(rate_hz)
            if nxt < t_end:
                push(nxt, "arrive")
        elif kind == "begin":
            name, size, per_item, i = payload  # type: ignore[misc]
            span = meter.begin()  # the meter reads right before the kernels start
            gpu.active += 1
            push(fake.now + size * per_item, "end", (span, name, size))
        elif kind == "end":
            span, name, size = payload  # type: ignore[misc]
            gpu.active -= 1
            meter.end(span)
            service.record_batch(name, "dynamic", size, span)
            run.spans.append((span, size, name))
    wait_for_step(run)
    run.counter1_mj, run.books1 = gpu.counter_reading_mj(), run.books()
    run.truth1 = (gpu.true_busy_j, gpu.true_idle_j)
    return run


def per_request_sum(run: Run, model: str | None = None) -> float:
    total = 0.0
    for span, size, name in run.spans:
        if model is None or name == model:
            joules = span.attributed_joules
            assert joules is not None, "every batch of the run has a final figure"
            total += (joules / size) * size  # what each of its requests was charged
    return total


@pytest.mark.parametrize(
    ("load", "rate_hz"),
    [("light", 8.0), ("heavy", 220.0)],  # busy ~4% and ~99% (saturated) of the time
)
def test_per_request_plus_idle_is_the_counter_delta_and_unbiased(load, rate_hz):
    run = simulate(rate_hz)
    busy_fraction = sum(s.end - s.start for s, _, _ in run.spans) / 5.0
    assert (busy_fraction < 0.1) if load == "light" else (busy_fraction > 0.7)
    assert run.counter_delta_j > 0
    # every joule the counter moved is a request's or idle, within 1%
    requests = per_request_sum(run)
    assert requests + run.idle == pytest.approx(run.counter_delta_j, rel=0.01)
    assert requests == pytest.approx(run.busy, rel=1e-9)
    # not biased: what requests were charged is the energy the GPU drew while they ran
    assert requests == pytest.approx(run.true_busy, rel=0.05)


def test_light_load_per_batch_counter_deltas_would_be_biased():
    """The double is faithful: deltas read around one 1-8 ms batch are mostly zero (the bug
    this design avoids), while the window attribution above is not."""
    run = simulate(8.0, seconds=2.0)
    naive = []
    gpu = FakeGpu(power_w=IDLE_W, busy_power_w=BUSY_W, update_period_s=0.05)
    fake = FakeNvml([gpu])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    for span, _, _ in run.spans:
        fake.advance(0.1)
        before = fake.nvmlDeviceGetTotalEnergyConsumption(handle)
        gpu.active += 1
        fake.advance(span.end - span.start)
        gpu.active -= 1
        naive.append(fake.nvmlDeviceGetTotalEnergyConsumption(handle) - before)
    assert sum(1 for d in naive if d == 0) > 0.7 * len(naive)


def test_coarse_quantum_and_slow_counter_still_sum_and_stay_unbiased():
    run = simulate(30.0, period_s=0.1, quantum_mj=50.0, seed=7)
    requests = per_request_sum(run)
    assert requests + run.idle == pytest.approx(run.counter_delta_j, rel=0.01)
    assert requests == pytest.approx(run.true_busy, rel=0.1)


def test_update_period_is_measured_and_published():
    run = simulate(8.0, seconds=0.5, period_s=0.04)
    service, registry = run.service, run.registry
    labels = {"device": "gpu0", "source": "nvml_counter"}
    period = registry.get_sample_value("wattserve_energy_counter_update_period_seconds", labels)
    assert period == pytest.approx(0.04, rel=0.1)
    assert service.poll_s == pytest.approx(0.004, rel=0.1)
    assert service._ledger.windows(0).stepwise
    service.sampler.sample_once()
    idle = registry.get_sample_value("wattserve_energy_idle_power_watts", labels)
    assert idle == pytest.approx(IDLE_W, rel=0.05)
    assert "update period" in service.describe()


def test_two_models_on_one_gpu_split_by_busy_time():
    """Two models, two instances overlapping on one GPU: each is charged by its busy time."""
    run = simulate(120.0, instances=2, models=(("big", 0.003), ("small", 0.001)), seed=3)
    big, small = per_request_sum(run, "big"), per_request_sum(run, "small")
    big_time = sum(s.end - s.start for s, _, n in run.spans if n == "big")
    small_time = sum(s.end - s.start for s, _, n in run.spans if n == "small")
    assert big / small == pytest.approx(big_time / small_time, rel=0.05)
    assert big + small + run.idle == pytest.approx(run.counter_delta_j, rel=0.01)
    # the histograms carry each model's figure, one observation per request
    get = run.registry.get_sample_value
    for name, joules in (("big", big), ("small", small)):
        labels = {"model": name, "batcher": "dynamic", "source": "nvml_counter"}
        requests = sum(size for _, size, n in run.spans if n == name)
        assert get("wattserve_energy_inference_joules_count", labels) == requests
        assert get("wattserve_energy_inference_joules_sum", labels) == pytest.approx(joules)


def test_cpu_engine_on_a_gpu_host_is_charged_no_gpu_energy(tmp_path):
    from tests.rapl_tree import make_zone, set_energy

    zone = make_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    fake = FakeNvml([FakeGpu(power_w=IDLE_W, busy_power_w=BUSY_W, update_period_s=0.05)])
    service, registry = start_service(fake, rapl_root=tmp_path)
    meter = service.meter_for("cpu")
    assert meter is not None and meter.devices == ["package-0"] and meter.source == "rapl"
    for i in range(20):
        span = meter.begin()
        fake.advance(0.01)
        set_energy(zone, (i + 1) * 200_000)  # the CPU package drew 0.2 J per batch
        meter.end(span)
        service.record_batch("cpu-model", "dynamic", 2, span)
        fake.advance(0.04)
        service.poll_once()
    fake.advance(0.1)
    service.poll_once()
    books = {a.device: a for a in service._ledger.snapshot()}
    assert books["gpu0"].busy == 0.0 and books["gpu0"].idle > 0  # the GPU's energy is all idle
    labels = {"model": "cpu-model", "batcher": "dynamic"}
    get = registry.get_sample_value
    assert get("wattserve_energy_inference_joules_count", {**labels, "source": "rapl"}) == 40
    assert get("wattserve_energy_inference_joules_count", {**labels, "source": "nvml_counter"}) is None
    # without RAPL, a CPU engine is not metered at all
    service2, _ = start_service(FakeNvml([FakeGpu()]))
    assert service2.meter_for("cpu") is None
    assert service2.meter_for("cuda:0").devices == ["gpu0"]
    assert service2.meter_for("cuda:3") is None  # no such GPU: not metered, not misattributed


def test_a_counter_that_stops_stepping_does_not_hold_batches_forever():
    fake = FakeNvml([FakeGpu(power_w=IDLE_W, update_period_s=0.05)])
    service, _ = start_service(fake)
    meter = service.meter_for("cuda:0")
    span = meter.begin()
    fake.advance(0.002)
    meter.end(span)
    fake.gpus[0].update_period_s = 1e9  # the counter freezes
    fake.gpus[0].counter_mj = float(fake.gpus[0].counter_reading_mj())
    for _ in range(120):
        fake.advance(0.1)
        service.poll_once()
    assert span.final and span.attributed_joules is None
    assert service._ledger.windows(0).pending == 0

"""The adaptive batcher's pure parts: the decision, the cost model and the arrival model.

No clocks: a small discrete-event simulation drives ``decide`` with seeded Poisson arrivals
and a known cost curve, so every assertion is about the policy, not about this machine.
"""

from __future__ import annotations

import numpy as np
import pytest
from wattserve.batchers.adaptive_decision import (
    CostView,
    Objective,
    QueueState,
    allowed_cap,
    answered_after,
    decide,
    doomed,
    doomed_prefix,
    late_batch,
    queueing_reserve,
    split_size,
)
from wattserve.batchers.arrival_model import ArrivalModel
from wattserve.batchers.cost_model import CostModel

MAX = 32
OBJ = Objective(slo_s=0.050, percentile=99, headroom_s=0.005)  # budget 45 ms


def affine(a_ms: float, c_ms: float, n: int = MAX) -> list[float]:
    return [0.0] + [(a_ms + c_ms * b) / 1000 for b in range(1, n + 1)]


GPU_LIKE = affine(10, 0.5)  # identity's benchmark curve: 10 ms + 0.5 ms per item
VIEW = CostView(GPU_LIKE, margin_s=0.002)


def simulate(
    rate: float, seconds: float, view: CostView, objective: Objective, seed: int = 0, caution: float = 0.0
):
    """One engine instance, Poisson arrivals at ``rate``; returns (latencies, batch sizes).

    The engine really takes ``view.seconds[b]`` (the model is exact): what is tested is
    the policy's use of it."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2) + 10))
    arrivals = arrivals[arrivals < seconds]
    latencies, sizes = [], []
    t, head, nxt = 0.0, 0, 0  # clock; first queued index; first not-yet-arrived index
    while head < len(arrivals):
        while nxt < len(arrivals) and arrivals[nxt] <= t:
            nxt += 1
        if nxt == head:  # nothing queued: idle until the next arrival
            t = arrivals[nxt]
            continue
        d = decide(QueueState(nxt - head, t - arrivals[head]), view, rate, objective, caution=caution)
        if d.dispatch:
            batch = arrivals[head : head + d.dispatch]
            t += view.seconds[d.dispatch]
            latencies.extend(t - batch)
            sizes.append(d.dispatch)
            head += d.dispatch
        else:
            t = min(t + d.wait_s, arrivals[nxt]) if nxt < len(arrivals) else t + d.wait_s
    return np.array(latencies), np.array(sizes)


# ---------------------------------------------------------------------------- decision
def test_waits_when_slack_allows_and_the_batch_grows():
    d = decide(QueueState(queued=1, oldest_age_s=0.0), VIEW, arrival_rate=400, objective=OBJ)
    assert d.dispatch == 0 and d.target > 1
    # the wait ends at the last moment the batch expected by then can still go
    assert d.wait_s == pytest.approx(OBJ.budget_s - VIEW.margin_s - GPU_LIKE[d.target])
    assert d.wait_s <= OBJ.budget_s - VIEW.margin_s - GPU_LIKE[2]
    # and the bigger batch is cheaper per request: that is why it waits
    assert GPU_LIKE[d.target] / d.target < GPU_LIKE[1]


def test_does_not_hold_a_request_when_nobody_is_coming():
    d = decide(QueueState(1, 0.0), VIEW, arrival_rate=0.5, objective=OBJ)  # one every 2 s
    assert d.dispatch == 1 and d.reason == "nobody coming"


def test_a_hold_limit_shortens_the_wait_from_the_oldest_arrival_and_the_target_with_it():
    free = decide(QueueState(1, 0.0), VIEW, 400, OBJ)
    held = decide(QueueState(1, 0.001), VIEW, 400, OBJ, max_hold_s=0.005)
    assert free.wait_s > 0.020 and held.dispatch == 0
    assert held.wait_s == pytest.approx(0.004)  # 5 ms from arrival, 1 ms of it gone
    assert held.target == 1 + 2 < free.target  # 400/s x 4 ms: two more expected
    done = decide(QueueState(2, 0.005), VIEW, 400, OBJ, max_hold_s=0.005)
    assert done.dispatch == 2 and done.reason == "held enough"
    # the limit is on waiting only: a full queue and a late one go as before
    assert decide(QueueState(MAX, 0.0), VIEW, 400, OBJ, max_hold_s=0.0).dispatch == MAX


CPU_LIKE = CostView(affine(1, 4, 16), margin_s=0.0)  # ONNX Runtime's mobilenet_v2 on 2 cores
CPU_OBJ = Objective(slo_s=0.100, percentile=99, headroom_s=0.010)  # budget 90 ms


def test_queueing_reserve_is_nothing_without_caution_and_grows_with_the_load():
    cap = allowed_cap(CPU_LIKE, CPU_OBJ)  # 45 ms of compute: 11 requests, 4.09 ms each
    per_request = CPU_LIKE.seconds[cap] / cap
    assert queueing_reserve(CPU_LIKE, 180, CPU_OBJ, cap, caution=0.0) == 0.0
    reserves = [
        queueing_reserve(CPU_LIKE, rate, CPU_OBJ, cap, caution=1.0) for rate in (1, 30, 120, 180, 230)
    ]
    assert reserves[0] == 0.0  # rho 0.4%: less likely to queue at all than the 1% allowed to miss
    assert reserves == sorted(reserves) and reserves[1] > 0
    rho = 180 * per_request  # M/M/1: the percentile of the wait, ln(rho / 1%) * s / (1 - rho)
    assert reserves[3] == pytest.approx(np.log(rho / 0.01) * per_request / (1 - rho))
    assert queueing_reserve(CPU_LIKE, 180, CPU_OBJ, cap, caution=2.0) == pytest.approx(2 * reserves[3])
    assert queueing_reserve(CPU_LIKE, 1 / per_request, CPU_OBJ, cap, caution=1.0) == float("inf")


def test_caution_stops_waiting_near_capacity_but_not_at_low_load():
    """What the back-off learned (``caution``) weighs by load: near capacity the queue
    behind a wait would miss, so the queue goes; at low load the wait still pays."""
    one = QueueState(queued=1, oldest_age_s=0.0)
    planned = decide(one, CPU_LIKE, 180, CPU_OBJ)
    assert planned.reason == "wait" and planned.target > 2  # no misses yet: plans as before
    near = decide(one, CPU_LIKE, 180, CPU_OBJ, caution=2.0)
    assert near.reason == "pair" and near.target == 2  # no planned wait: at most a pair (rule 7)
    assert near.wait_s < planned.wait_s
    assert decide(QueueState(2, 0.0), CPU_LIKE, 180, CPU_OBJ, caution=2.0).dispatch == 2
    low = decide(one, CPU_LIKE, 30, CPU_OBJ, caution=2.0)
    assert low.reason == "wait"
    assert low.wait_s < decide(one, CPU_LIKE, 30, CPU_OBJ).wait_s  # shorter by the reserve
    # a lull in the last 100 ms does not make the queue behind a busy second shorter
    lull = decide(one, CPU_LIKE, 30, CPU_OBJ, sustained_rate=180, caution=2.0)
    assert lull.reason == "pair"


def test_a_lone_request_near_capacity_waits_for_a_pair_no_longer_than_its_own_batch():
    """Rule 7: where the queueing reserve leaves no room for a planned wait, a request alone
    waits at most the time its own batch would hold the engine (a request arriving then
    would queue behind it anyway), and only where a pair is cheaper per request."""
    one = QueueState(queued=1, oldest_age_s=0.0)
    pair = decide(one, CPU_LIKE, 180, CPU_OBJ, caution=2.0)
    assert pair.dispatch == 0 and pair.wait_s == pytest.approx(CPU_LIKE.seconds[1])
    # the back-off's hold bounds it as it bounds any wait, from the oldest arrival
    held = decide(QueueState(1, 0.001), CPU_LIKE, 180, CPU_OBJ, max_hold_s=0.003, caution=2.0)
    assert held.reason == "pair" and held.wait_s == pytest.approx(0.002)
    assert decide(QueueState(1, 0.003), CPU_LIKE, 180, CPU_OBJ, max_hold_s=0.003, caution=2.0).dispatch == 1
    # and the pair must still fit the objective: late, the lone request goes
    late = QueueState(1, CPU_OBJ.budget_s - CPU_LIKE.seconds[2] - 0.001)
    short = decide(late, CPU_LIKE, 180, CPU_OBJ, caution=2.0)
    assert short.reason == "pair" and short.wait_s == pytest.approx(0.001)
    assert decide(QueueState(1, late.oldest_age_s + 0.001), CPU_LIKE, 180, CPU_OBJ, caution=2.0).dispatch == 1
    # where a pair costs exactly twice a single, pairing saves nothing: no wait
    linear = CostView(affine(0, 4, 16))
    assert decide(one, linear, 180, CPU_OBJ, caution=2.0).reason == "efficient now"


def test_near_capacity_no_request_runs_alone_and_the_objective_holds():
    """At 190 requests/s batches of one would keep the engine 95% busy; at the back-off's
    full caution no wait is planned (without rule 7, over half the batches here were of
    one, at 4% more engine time per request); pairs, within the objective."""
    latencies, sizes = simulate(190, 60, CPU_LIKE, CPU_OBJ, seed=3, caution=2.0)
    assert np.percentile(latencies, 99) <= CPU_OBJ.budget_s
    assert (sizes == 1).sum() == 0 and sizes.mean() > 2


# ONNX Runtime's mobilenet_v2 as served on this 2-core host: 4.6 ms per image up to 8,
# 5.0 ms per image at 9-16 (a batch of 16 is 9% dearer per image than two of 8)
SERVED_CPU = CostView([0.0] + [(4.6 if b <= 8 else 5.0) * b / 1000 for b in range(1, 17)])


def test_split_only_where_two_batches_take_less_engine_time_than_one():
    """Rule 8: a full batch goes as 8 + 8 where 16 at once costs more per image; an affine
    curve (any intercept) never splits, nor does a gain under SPLIT_GAIN."""
    assert split_size(SERVED_CPU.seconds, 16) == 8
    assert split_size(SERVED_CPU.seconds, 12) == 8  # 8 + 4: 55.2 ms against 60
    assert split_size(SERVED_CPU.seconds, 8) == 8
    for n in range(1, MAX + 1):
        assert split_size(GPU_LIKE, n) == n
        assert split_size(affine(0, 4), n) == n
    almost = [0.0] + [(4.6 if b <= 8 else 4.7) * b / 1000 for b in range(1, 17)]
    assert split_size(almost, 16) == 16  # 2% less: within the cost model's noise
    full = decide(QueueState(16, 0.0), SERVED_CPU, 190, CPU_OBJ)
    assert (full.dispatch, full.reason) == (8, "split")
    late = decide(QueueState(12, 0.080), SERVED_CPU, 190, CPU_OBJ)
    assert (late.dispatch, late.reason) == (8, "split")  # the deadline's queue, in two


def test_splitting_drains_a_backlog_that_full_batches_cannot():
    """At 208 requests/s batches of 16 carry 200/s and batches of 8 carry 217/s: sent
    whole, the queue grows for the whole run; split, it stays short."""
    latencies, sizes = simulate(208, 30, SERVED_CPU, CPU_OBJ, seed=5, caution=2.0)
    assert sizes.max() <= 8
    assert np.percentile(latencies, 99) < 0.5  # whole batches: past 2 s by the end


def test_more_slack_or_more_traffic_means_a_bigger_target():
    slow = decide(QueueState(1, 0.0), VIEW, 100, OBJ)
    fast = decide(QueueState(1, 0.0), VIEW, 600, OBJ)
    older = decide(QueueState(1, 0.020), VIEW, 600, OBJ)
    assert slow.target < fast.target
    assert older.target < fast.target


def test_dispatches_when_waiting_would_miss_the_objective():
    # oldest has waited so long that only the compute of what is queued still fits
    age = OBJ.budget_s - VIEW.margin_s - GPU_LIKE[3] - 0.0001
    d = decide(QueueState(3, age), VIEW, 300, OBJ)
    assert d.dispatch == 3


def test_never_waits_past_the_objective():
    """Whatever the queue, age and rate: if it waits, then at the end of the wait the queue
    plus one more request still finishes within the budget."""
    rng = np.random.default_rng(1)
    for _ in range(5000):
        q = int(rng.integers(1, MAX))
        age = float(rng.uniform(0, OBJ.budget_s))
        rate = float(rng.uniform(1, 3000))
        d = decide(QueueState(q, age), VIEW, rate, OBJ)
        if d.dispatch == 0:
            assert d.target > q
            # even one more request, arriving at the very end of the wait, still fits
            assert age + d.wait_s + GPU_LIKE[q + 1] + VIEW.margin_s <= OBJ.budget_s + 1e-12
            assert GPU_LIKE[d.target] <= (OBJ.budget_s - VIEW.margin_s) / 2 + 1e-12  # the cap
        else:
            assert d.dispatch == min(q, MAX)


@pytest.mark.parametrize("load", [0.05, 0.3, 0.7])
def test_simulated_load_meets_the_objective_at_every_load(load):
    capacity = MAX / GPU_LIKE[MAX]
    latencies, sizes = simulate(load * capacity, 20, VIEW, OBJ)
    assert np.percentile(latencies, 99) <= OBJ.slo_s
    # it batches: never below what serving them one at a time would need
    assert sizes.mean() > 1.5


def test_full_batches_under_overload():
    assert decide(QueueState(40, 0.0), VIEW, 10, OBJ).dispatch == MAX
    capacity = MAX / GPU_LIKE[MAX]
    d = decide(QueueState(5, 0.0), VIEW, 1.2 * capacity, OBJ)
    assert d.dispatch == 5 and d.reason == "overload"  # work-conserving: the queue refills
    _, sizes = simulate(1.2 * capacity, 5, VIEW, OBJ)
    assert np.mean(sizes[len(sizes) // 4 :]) > 0.97 * MAX  # once the backlog builds: full


def test_prefers_joules_where_measured():
    # energy says batch 4 is the sweet spot (say, power jumps beyond it): no waiting past 4
    joules = [0.0] + [1.0 * b if b <= 4 else 10.0 * b for b in range(1, MAX + 1)]
    view = CostView(GPU_LIKE, margin_s=0.002, joules=joules)
    d = decide(QueueState(1, 0.0), view, 1000, OBJ)
    assert d.target == 1 or d.target <= 4
    plain = decide(QueueState(1, 0.0), VIEW, 1000, OBJ)
    assert plain.target > 4


def test_cap_leaves_room_for_a_request_arriving_during_the_batch():
    cap = allowed_cap(VIEW, OBJ)
    assert GPU_LIKE[cap] <= (OBJ.budget_s - VIEW.margin_s) / 2 < GPU_LIKE[cap + 1]


def test_doomed_counts_batches_ahead():
    view = CostView(affine(10, 0.5, 4), margin_s=0.0)  # max batch 4: 12 ms a full batch
    obj = Objective(0.030, 99, 0.0)
    ages = [0.020, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    # first: 20 + 12 > 30 -> doomed; positions 4..7 ride second (24 ms) -> fine; 8 third (36)
    assert doomed(ages, view, obj) == [0, 8]


# ---------------------------------------------------------------------------- cost model
def test_cost_model_seeds_and_fills_sizes_it_did_not_time():
    model = CostModel(MAX)
    model.seed({b: GPU_LIKE[b] for b in (1, 2, 4, 8, 16, 32)})
    for b in (3, 5, 12, 24):
        assert model.seconds(b) == pytest.approx(GPU_LIKE[b], rel=1e-6)
    a, c = model.fit()
    assert a == pytest.approx(0.010) and c == pytest.approx(0.0005)


def test_learns_a_changed_cost_curve():
    """The engine gets twice as slow and steeper (20 ms + 1 ms/item); mostly small batches
    are observed, yet the prediction for every size follows, and the decision with it."""
    model = CostModel(MAX)
    model.seed({b: GPU_LIKE[b] for b in (1, 2, 4, 8, 16, 32)})
    new = affine(20, 1.0)
    rng = np.random.default_rng(0)
    for _ in range(150):
        b = int(rng.choice([1, 2, 3, 4, 6, 8]))
        model.observe(b, new[b] * float(rng.uniform(0.97, 1.03)))
    for b in (1, 4, 8):
        assert model.seconds(b) == pytest.approx(new[b], rel=0.06)
    for b in (16, 32):  # never observed after the change: moved by the global scale
        assert model.seconds(b) > 1.6 * GPU_LIKE[b]
    before = decide(QueueState(1, 0.0), VIEW, 400, OBJ)
    after = decide(QueueState(1, 0.0), CostView(model.curve().tolist(), model.margin()), 400, OBJ)
    assert after.target < before.target


def test_one_stall_does_not_rewrite_the_model_but_raises_the_margin():
    model = CostModel(MAX, percentile=99)
    model.seed({b: GPU_LIKE[b] for b in (1, 32)})
    for _ in range(50):
        model.observe(8, GPU_LIKE[8])
    model.observe(8, 1.0)  # a one-second stall
    assert model.seconds(8) < 3.1 * GPU_LIKE[8]
    assert model.margin() > 0.1


def test_predictions_never_decrease_with_size():
    model = CostModel(8)
    model.seed({1: 0.010, 2: 0.009, 4: 0.012, 8: 0.011})  # noisy timings
    curve = model.curve()
    assert all(curve[b] <= curve[b + 1] for b in range(1, 8))


def test_joules_where_measured_and_scaled_by_seconds_elsewhere():
    model = CostModel(4)
    model.seed({1: 0.010, 4: 0.040})
    assert model.joule_curve() is None
    model.observe(1, 0.010, joules=2.0)  # 200 W
    curve = model.joule_curve()
    assert curve[1] == pytest.approx(2.0)
    assert curve[4] == pytest.approx(0.040 * 200, rel=0.05)


# ---------------------------------------------------------------------------- arrival model
def test_arrival_rate_sees_a_burst_at_once_and_steadies_on_the_long_window():
    m = ArrivalModel(short_s=0.1, long_s=2.0, min_short=8)
    t = 0.0
    for _ in range(200):  # 100 req/s for 2 s
        t += 0.01
        m.arrived(t)
    assert m.rate(t) == pytest.approx(100, rel=0.15)
    for _ in range(100):  # then 1000 req/s for 0.1 s
        t += 0.001
        m.arrived(t)
    assert m.rate(t) == pytest.approx(1000, rel=0.15)
    _, long_ = m.rates(t)
    assert long_ < 200
    assert m.rate_and_long(t) == (m.rate(t), long_)  # one pass, the same two figures
    quiet = t + 1.0  # a second of silence: too few in the short window, the long one speaks
    assert m.rate(quiet) == pytest.approx(m.rates(quiet)[1])


def test_arrival_model_memory_is_bounded():
    m = ArrivalModel(max_kept=100)
    for i in range(10_000):
        m.arrived(i * 1e-6)
    assert len(m._long.times) <= 100


# ---------------------------------------------------------------------------- joule mode
def superlinear_joules(seconds: list[float], idle_w: float, k_w: float, extra_w: float = 40.0) -> list[float]:
    """Busy joules of a batch on a device drawing idle + extra + k * b^2 watts while it runs
    (telemetry/simulated_gpu.py's "superlinear" shape)."""
    return [0.0] + [(idle_w + extra_w + k_w * b * b) * seconds[b] for b in range(1, len(seconds))]


def test_choice_moves_with_the_mode_when_joules_and_seconds_disagree():
    """Seconds per item fall all the way to the cap; joules per item (above idle) are least
    near sqrt((40 + 10 ms-worth) / k): the decision waits for a big batch in seconds mode and
    stops near the energy sweet spot in joule mode."""
    idle = 60.0
    joules = superlinear_joules(GPU_LIKE, idle, k_w=2.5)
    seconds_mode = decide(QueueState(3, 0.0), VIEW, 1000, OBJ)
    joule_mode = decide(QueueState(3, 0.0), CostView(GPU_LIKE, 0.002, joules, idle), 1000, OBJ)
    assert seconds_mode.dispatch == 0 and seconds_mode.target > 8  # waits for a big batch
    per_item = [v / b for b, v in enumerate(CostView(GPU_LIKE, 0.002, joules, idle).values()) if b]
    best = 1 + int(np.argmin(per_item))
    assert 3 <= best <= 8
    assert joule_mode.target <= best + 1  # waits at most for the energy sweet spot
    # past the sweet spot, joule mode goes at once; seconds mode would still wait
    past = decide(QueueState(best, 0.0), CostView(GPU_LIKE, 0.002, joules, idle), 1000, OBJ)
    assert past.dispatch == best and past.reason == "efficient now"
    assert decide(QueueState(best, 0.0), VIEW, 1000, OBJ).dispatch == 0


def test_idle_power_is_what_the_device_draws_anyway():
    """Busy joules include the idle baseline over the batch's time; without subtracting it,
    a flat-power device looks like it favours no size, with it the fixed cost shows."""
    idle = 100.0
    joules = [0.0] + [idle * t for t in GPU_LIKE[1:]]  # a device that draws nothing above idle
    view = CostView(GPU_LIKE, 0.002, joules, idle)
    assert all(v == pytest.approx(1e-6 * j) for v, j in zip(view.values()[1:], joules[1:], strict=True))
    assert CostView(GPU_LIKE, 0.002, joules).values() == joules  # no idle figure: busy joules


def test_energy_arrives_late_and_the_mode_says_why():
    model = CostModel(8)
    model.seed({1: 0.010, 8: 0.020})
    assert model.energy_mode() == ("seconds", "no meter")
    for _ in range(3):
        model.observe(2, 0.012)  # the batch's seconds now; its joules a counter step later
        model.observe_energy(2, 2.4, idle_watts=60.0)
    assert model.energy_mode() == ("seconds", "meter warming up")
    for _ in range(5):
        model.observe_energy(8, 6.0, idle_watts=61.0)
    assert model.energy_mode() == ("joules", "joules") and model.idle_watts == 61.0
    curve = model.joule_curve()
    assert curve is not None and curve[2] == pytest.approx(2.4) and curve[8] == pytest.approx(6.0)
    # sizes between: predicted seconds times power fitted along size (power rises with b)
    assert 2.4 < curve[4] < 6.0
    model.observe_energy(3, float("nan"))
    model.observe_energy(0, 1.0)
    assert model.metered == 8  # nonsense is not counted


def test_joule_mode_spends_fewer_joules_per_inference_at_equal_attainment():
    """The same Poisson traffic served by the decision in both modes on the "superlinear"
    device (seconds per item favour big batches, joules per item a middling one): joule mode
    uses fewer simulated joules per inference, idle energy included, and both meet the
    objective."""
    idle = 60.0
    joules = superlinear_joules(GPU_LIKE, idle, k_w=2.5)
    joule_view = CostView(GPU_LIKE, 0.002, joules, idle)
    results = {}
    for mode, view in (("seconds", VIEW), ("joules", joule_view)):
        latencies, sizes = simulate(400, 20, view, OBJ, seed=3)
        busy_s = sum(GPU_LIKE[b] for b in sizes)
        total_j = sum(joules[b] for b in sizes) + idle * (20 - busy_s)  # busy + idle, 20 s
        results[mode] = (total_j / len(latencies), np.percentile(latencies, 99), np.mean(sizes))
    (j_s, p99_s, b_s), (j_j, p99_j, b_j) = results["seconds"], results["joules"]
    assert p99_s <= OBJ.budget_s and p99_j <= OBJ.budget_s  # equal attainment: both meet it
    assert b_j < b_s  # smaller batches...
    assert j_j < 0.95 * j_s  # ...and fewer joules per inference


def test_a_margin_that_eats_the_budget_stops_the_waiting_but_not_the_batches():
    """A host whose answers come 36 ms later than planned (p99) with a 45 ms budget: the
    batch-size cap plans with a quarter of the budget (so the batches that keep up with the
    arrivals are still allowed), but no wait is planned: the time a wait gives up on purpose
    is what the stalls take."""
    stalled = CostView(GPU_LIKE, margin_s=0.036)  # 9 ms left: not even a batch of 1 (10.5 ms)
    d = decide(QueueState(queued=1, oldest_age_s=0.0), stalled, arrival_rate=400, objective=OBJ)
    assert d.dispatch == 1 and d.reason == "deadline"
    assert allowed_cap(stalled, OBJ) == allowed_cap(CostView(GPU_LIKE, margin_s=OBJ.budget_s / 4), OBJ) > 1
    # a smaller margin leaves some slack, and the wait plans with all of the margin
    d = decide(QueueState(queued=1, oldest_age_s=0.0), CostView(GPU_LIKE, margin_s=0.015), 400, OBJ)
    assert d.dispatch == 0
    assert d.wait_s == pytest.approx(OBJ.budget_s - 0.015 - GPU_LIKE[d.target])


def test_answered_after_counts_whole_rounds_then_the_last_rounds_share() -> None:
    view = CostView(affine(10, 1, 8), bias_s=0.001)  # a batch of 8: 18 ms (+1 ms bias)
    one_batch = view.seconds[8] + 0.001
    assert answered_after(view, 8, 3, 20) == pytest.approx(one_batch)  # first of three rounds
    assert answered_after(view, 8, 12, 20) == pytest.approx(2 * one_batch)
    assert answered_after(view, 8, 17, 20) == pytest.approx(2 * one_batch + view.seconds[4] + 0.001)
    assert answered_after(view, 8, 5, 5) == pytest.approx(view.seconds[5] + 0.001)  # one partial batch
    # two engines: a round is 16 requests; the last round's 4 split 2 and 2
    assert answered_after(view, 8, 20, 20, instances=2) == pytest.approx(one_batch + view.seconds[2] + 0.001)
    times = [answered_after(view, 8, n, 37) for n in range(1, 38)]
    assert times == sorted(times)


def _fewest_by_scan(ages, ahead, view, objective, batch) -> int:
    limit = objective.budget_s - view.held_back(objective)
    total = ahead + len(ages)
    for moved in range(len(ages) + 1):
        rest = range(moved, len(ages))
        if all(
            ages[p] + answered_after(view, batch, ahead + p - moved + 1, total - moved) <= limit for p in rest
        ):
            return moved
    raise AssertionError("moving all always meets")


def test_doomed_prefix_is_the_fewest_oldest_that_lets_the_rest_meet() -> None:
    """Against a plain scan over every count, on random backlogs (ages oldest first, some
    requests queued ahead): the bisection finds the same count."""
    rng = np.random.default_rng(7)
    view = CostView(affine(4, 3, 16), margin_s=0.004)  # a batch of 8: 28 ms
    seen = set()
    for _ in range(300):
        count, ahead = int(rng.integers(1, 40)), int(rng.integers(0, 10))
        ages = sorted(rng.uniform(0, 0.045, count), reverse=True)
        got = doomed_prefix(ages, ahead, view, OBJ, 8)
        assert got == _fewest_by_scan(ages, ahead, view, OBJ, 8)
        seen.add(min(got, 2))
    assert seen == {0, 1, 2}  # the cases were mixed: none, one, several moved


def test_doomed_prefix_moves_nothing_unlearned_or_in_time() -> None:
    assert doomed_prefix([0.040, 0.001], 0, CostView([0.0] * 9), OBJ, 8) == 0  # nothing learned
    view = CostView(affine(4, 3, 16), margin_s=0.004)
    assert doomed_prefix([0.010, 0.005], 0, view, OBJ, 8) == 0
    # too old even alone (45 - 4 margin - 7 ms): moved, though nothing is queued behind it
    assert doomed_prefix([0.035], 0, view, OBJ, 8) == 1


def test_a_split_pays_for_its_second_hand_off() -> None:
    """12 as 8 + 4 saves 4.8 ms of compute on the served-CPU curve; a hand-off of 6 ms per
    batch costs more than that, so the batch goes whole."""
    assert split_size(SERVED_CPU.seconds, 12) == 8
    assert split_size(SERVED_CPU.seconds, 12, extra_s=0.006) == 12


def test_late_batches_are_sized_with_the_capped_margin() -> None:
    """A margin past a quarter of the budget (a stalling host) does not shrink the batch
    that serves the on-time requests with late ones: 45 ms budget, 11.25 ms held back
    (not 30), 10 ms old: 23.75 ms left, 4 ms + 3 ms per request fits 6."""
    view = CostView(affine(4, 3, 16), margin_s=0.030)
    assert late_batch(2, 10, 0.010, view, OBJ) == 6

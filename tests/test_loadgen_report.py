"""Reports with energy data: the Pareto front, the energy and power figures, the telemetry table.

This machine has no GPU, so live runs never carry energy figures; here the runs' server-side
windows are written by hand (as window_stats would produce them from a GPU server's metrics)
to exercise the figures that only appear with energy data.
"""

from __future__ import annotations

import json

from wattserve.loadgen import report
from wattserve.loadgen.plots import pareto_front

from tests.energy_runs import fake_run


def test_pareto_front_keeps_points_not_beaten_on_both_axes() -> None:
    points = [(10.0, 5.0), (20.0, 3.0), (15.0, 6.0), (30.0, 3.0), (40.0, 1.0), (5.0, 9.0)]
    assert pareto_front(points) == [5, 0, 1, 4]
    assert pareto_front([]) == []


def test_report_with_energy_draws_pareto_power_and_telemetry(tmp_path) -> None:
    runs = [
        fake_run("a", 20, 0.010, 2.0),
        fake_run("b", 40, 0.020, 1.0),
        fake_run("c", 60, 0.050, 1.5),  # slower and costlier than b: off the front
    ]
    paths = report.write_all(tmp_path, runs, "energy report")
    assert {"energy_latency", "power", "batch_sizes", "latency_cdf", "latency_tail"} <= set(paths)
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 6
    assert "Telemetry over each window" in page and "wattserve_gpu_power_watts" in page
    assert "busy + idle" in page
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["notes"] == []  # nothing skipped
    assert [r["server"]["energy_per_inference_j"] for r in doc["runs"]] == [2.0, 1.0, 1.5]


def test_report_without_energy_says_so(tmp_path) -> None:
    runs = [fake_run("a", 20, 0.010, None)]
    for r in runs:
        r.server["telemetry"] = []
        r.power_series = {}
    paths = report.write_all(tmp_path, runs, "no energy")
    assert "energy_latency" not in paths and "power" not in paths
    doc = json.loads((tmp_path / "results.json").read_text())
    assert any("energy vs latency plot skipped" in n for n in doc["notes"])
    assert any("power-over-time plot skipped" in n for n in doc["notes"])
    page = (tmp_path / "report.html").read_text()
    assert "not available" in page


def test_study_report_answers_its_question_first(tmp_path) -> None:
    """The first screen: which configuration meets the objective at the fewest joules at each
    load, in a sentence and a picture, before the tables."""
    from wattserve.loadgen.study import verdict

    runs = []
    for batching, energy_low, energy_high, latency in (("dyn", 2.0, 1.0, 0.010), ("static", 1.5, 0.8, 0.300)):
        for workload, rate, energy in (("low", 20, energy_low), ("high", 40, energy_high)):
            run = fake_run(f"{batching} {workload}", rate, latency, energy)
            run.extra = {"model": "m", "batching": batching, "workload": workload}
            runs.append(run)
    result = verdict(runs, 95.0, 100.0)
    paths = report.write_all(tmp_path, runs, "study", extra={"verdict": result})
    assert "study_headline" in paths
    page = (tmp_path / "report.html").read_text()
    answer = page.index('<div class="answer">')
    assert answer < page.index("<h2>Runs</h2>")
    sentence = page[answer : page.index("</div>", answer)]
    # static is cheaper but misses p95 <= 100 ms: dyn is the answer at both loads.
    assert "fewest joules" in sentence
    assert "<b>dyn</b> at low (20/s) (2 J)" in sentence and "<b>dyn</b> at high (40/s) (1 J)" in sentence
    assert "static" not in sentence
    head = page[: page.index("<h2>Runs</h2>")]
    assert head.count("data:image/png;base64,") == 1  # the one picture, above the tables

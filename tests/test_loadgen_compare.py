"""``wattserve report compare``: two real loadgen runs against a live wattserve (identity) on
loopback, one of them declared invalid by the generator, read back and set side by side.

Also the figures' promises, checked on the drawn matplotlib objects: series named in the
legend, the objective and the capacity drawn, invalid runs hollow and labelled, millisecond
tick labels (no 10^k), CDF lines in rate order.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from PIL import Image
from wattserve.loadgen import compare, plots
from wattserve.loadgen.runner import LoadSpec, RunResult, summarize
from wattserve.loadgen.stats import RequestRecord
from wattserve.server.cli import main as wattserve_main

from tests.servers import server_process


def fake_run(rate: float, latency_ms: float, lag_s: float = 0.0) -> RunResult:
    spec = LoadSpec("poisson", rate=rate, warmup_s=0.0, duration_s=2.0, max_lag_ms=10.0, label=f"r{rate:g}")
    n = int(rate * 2)
    records = [
        RequestRecord(
            i, i / rate, i / rate + lag_s, i / rate + lag_s + latency_ms / 1000 * (1 + i % 7 / 7), "200"
        )
        for i in range(n)
    ]
    return RunResult(
        spec.label, spec, {"model": "identity"}, records, summarize(records, spec, n), None, {}, "now"
    )


@pytest.fixture
def drawn(monkeypatch):
    """The figures as drawn (plots._save is where they are written and closed)."""
    figures: list[plt.Figure] = []
    real_save = plots._save

    def keep(fig, path):
        figures.append(fig)
        fig.canvas.draw()  # tick labels exist once drawn
        texts = [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]
        ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
        fig._seen = (texts, ticks)  # type: ignore[attr-defined]
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def test_throughput_plot_names_series_marks_objective_capacity_and_invalid(tmp_path, drawn) -> None:
    runs = [fake_run(100, 4), fake_run(200, 8), fake_run(400, 40, lag_s=0.05)]
    assert not runs[2].summary["valid"]
    marks = plots.Marks(slo_ms=20, percentile=99, capacity=200)
    path, note = plots.throughput_latency(runs, tmp_path / "t.png", marks=marks)
    assert path and note is None
    legend = drawn[0]._seen[0]
    assert "identity" in legend and "run" not in legend
    assert any("invalid" in t for t in legend)
    assert "objective p99 \u2264 20 ms" in legend
    assert "capacity found: 200 req/s" in legend
    ax = drawn[0].axes[0]
    hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "none" and len(ln.get_xdata())]
    assert hollow and all(
        x == pytest.approx(runs[2].summary["achieved_rate"]) for ln in hollow for x in ln.get_xdata()
    )
    y_ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert set(y_ticks) & {"5", "10", "20", "50"}, y_ticks
    assert not any("10^" in t or "$" in t for t in y_ticks)


def test_cdf_sorts_runs_by_rate_and_draws_the_objective_and_a_tail_view(tmp_path, drawn) -> None:
    runs = [fake_run(400, 20), fake_run(100, 4), fake_run(200, 8)]  # the order a search tries them
    marks = plots.Marks(slo_ms=20, percentile=99)
    plots.latency_cdf(runs, tmp_path / "c.png", marks=marks)
    plots.latency_cdf(runs, tmp_path / "tail.png", marks=marks, tail=True)
    cdf_legend, cdf_ticks = drawn[0]._seen
    assert {"5", "10", "20"} <= set(cdf_ticks), cdf_ticks
    assert cdf_legend[:3] == ["r100", "r200", "r400"]
    assert "objective p99 \u2264 20 ms" in cdf_legend
    tail_ax = drawn[1].axes[0]
    assert tail_ax.get_yscale() == "log"
    assert {"p90", "p99"} <= {t.get_text() for t in tail_ax.get_yticklabels()}
    assert any(
        ln.get_ydata()[0] == pytest.approx(0.01) for ln in tail_ax.get_lines() if len(ln.get_ydata()) == 2
    )


@pytest.fixture(scope="module")
def identity_url():
    env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_LOG_LEVEL": "warning"}
    with server_process(env) as proc:
        yield proc.url


def loadgen(url: str, out: Path, *extra: str) -> int:
    return wattserve_main(
        ["loadgen", "--url", url, "--model", "identity", "--rates", "20,40", "--arrival", "constant",
         "--warmup", "0.3", "--duration", "1.5", "--no-progress", "--out", str(out), *extra]
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.serial  # the good run must keep up (valid, throughput within 20%)
def test_compare_two_real_runs_one_invalid(identity_url: str, tmp_path: Path, capsys) -> None:
    good, bad = tmp_path / "before", tmp_path / "after"
    assert loadgen(identity_url, good, "--max-lag-ms", "200") == 0
    # A lag limit no generator meets: the generator itself declares these runs invalid.
    assert loadgen(identity_url, bad, "--max-lag-ms", "0.000001") == 0
    assert json.loads((bad / "results.json").read_text())["valid"] is False
    out = tmp_path / "cmp"
    assert wattserve_main(["report", "compare", str(good), str(bad), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("after / before")]
    assert len(lines) == 2 and "constant 20/s" in lines[0] and "constant 40/s" in lines[1]
    assert all("NOTE after invalid: generator could not keep up" in line for line in lines)
    doc = json.loads((out / "compare.json").read_text())
    assert [s["name"] for s in doc["sets"]] == ["before", "after"]
    row = doc["ratios"][0]
    a, b, ratio = row["p99_ms"]
    assert ratio == pytest.approx(b / a)
    assert row["throughput"][2] == pytest.approx(1.0, rel=0.2)  # same offered load, both kept up
    assert row["j_per_inference"] == [None, None, None]  # no energy measured here: no ratio invented
    for name in ("throughput_latency.png", "latency_cdf.png", "latency_tail.png"):
        with Image.open(out / name) as img:
            assert img.width >= 400
    page = (out / "compare.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "after invalid" in page
    # The folders read back hold the same runs: exact CDFs come from the saved requests.
    _, runs = compare.load_runs(good)
    saved = json.loads((good / "results.json").read_text())["runs"]
    assert [r.summary["completed"] for r in runs] == [r["completed"] for r in saved]
    assert [sum(1 for q in r.measured() if q.ok) for r in runs] == [r["completed"] for r in saved]


def test_compare_refuses_a_folder_without_results(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        wattserve_main(["report", "compare", str(tmp_path), str(tmp_path)])
    assert exc.value.code == 2
    assert "no results.json" in capsys.readouterr().err

"""End to end: ``wattserve loadgen`` against a live wattserve (identity model) on loopback.

The files it writes are read back and their numbers checked against each other and against
the schedule the seed determines: JSON, both CSVs, the PNGs and the self-contained HTML.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from wattserve.loadgen.arrivals import make_schedule
from wattserve.loadgen.cli import main

from tests.servers import server_process

pytestmark = pytest.mark.slow

PERCENTILES = ["p50", "p90", "p95", "p99", "p99.9"]


@pytest.fixture(scope="module")
def wattserve():
    env = {
        "WATTSERVE_MODEL": "identity",
        "WATTSERVE_BATCHER": "dynamic",
        "WATTSERVE_MAX_BATCH_SIZE": "8",
        "WATTSERVE_MAX_QUEUE_DELAY_MS": "2",
        "WATTSERVE_LOG_LEVEL": "warning",
    }
    with server_process(env) as proc:
        yield proc.url


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def check_figures_and_html(out: Path, labels: list[str]) -> None:
    pngs = sorted(out.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"latency_cdf.png", "throughput_latency.png", "batch_sizes.png"} <= names
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(png) as img:
            assert img.width >= 300 and img.height >= 200
    page = (out / "report.html").read_text()
    # Self-contained: every figure embedded, nothing fetched from elsewhere.
    assert page.count("data:image/png;base64,") == len(pngs)
    assert not re.search(r'src="(https?:|/)', page)
    for label in labels:
        assert label in page
    # No energy here (CPU only): the report says so rather than drawing an empty plot.
    doc = json.loads((out / "results.json").read_text())
    if all(r["server"]["energy_per_inference_j"] is None for r in doc["runs"]):
        assert "energy_latency.png" not in names
        assert "energy vs latency plot skipped" in page


@pytest.mark.serial  # the run must be valid: the generator keeps up
def test_poisson_run_writes_consistent_json_csv_png_html(wattserve: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    rate, warmup, duration, seed = 40.0, 1.0, 4.0, 11
    code = main(
        ["loadgen", "--url", wattserve, "--model", "identity", "--arrival", "poisson",
         "--rate", str(rate), "--warmup", str(warmup), "--duration", str(duration),
         "--seed", str(seed), "--binary", "--max-lag-ms", "100", "--out", str(out),
         "--no-progress"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["valid"] is True and len(doc["runs"]) == 1
    run = doc["runs"][0]
    assert run["target"]["protocol"] == "binary" and run["target"]["metrics"] is True

    # The schedule is a pure function of the seed: the run sent exactly its window's part.
    schedule = make_schedule("poisson", rate, warmup + duration, seed)
    in_window = int(np.count_nonzero((schedule >= warmup) & (schedule < warmup + duration)))
    assert run["scheduled"] == run["sent"] == in_window
    assert run["completed"] + run["failed"] == run["sent"]
    assert run["failed"] == 0 and run["errors_by_status"] == {}
    assert run["offered_rate"] == pytest.approx(in_window / duration)
    # The server keeps up with 40 req/s of identity: completions track arrivals.
    assert run["achieved_rate"] == pytest.approx(run["offered_rate"], rel=0.1)

    lat = run["latency_ms"]
    values = [lat[p] for p in PERCENTILES]
    assert values == sorted(values)
    assert lat["min"] <= lat["p50"] and lat["p99.9"] <= lat["max"]
    assert lat["count"] == run["completed"]

    # requests.csv: one row per request; the measured ones match the JSON exactly.
    rows = read_csv(out / "requests.csv")
    assert sum(1 for r in rows if r["phase"] != "after") == schedule.size
    measured = [r for r in rows if r["phase"] == "measure"]
    assert len(measured) == run["sent"]
    ok = [r for r in measured if r["status"] == "200"]
    assert len(ok) == run["completed"]
    latencies = [float(r["latency_ms"]) for r in ok]
    assert max(latencies) == pytest.approx(lat["max"], abs=0.002)
    assert sum(latencies) / len(latencies) == pytest.approx(lat["mean"], rel=1e-3)
    assert all(float(r["lag_ms"]) >= -1.0 for r in rows)
    # wattserve's response headers were recorded per request.
    assert all(r["batch_size"] and float(r["queue_ms"]) >= 0 for r in ok)

    summary = read_csv(out / "summary.csv")
    assert len(summary) == 1
    assert int(summary[0]["completed"]) == run["completed"]
    assert float(summary[0]["latency_p99_ms"]) == pytest.approx(lat["p99"], rel=1e-5)
    assert summary[0]["valid"] == "True"

    # Server side over the window, from /metrics.
    server = run["server"]
    assert server["inferences"] == pytest.approx(run["completed"], rel=0.15)
    assert 1.0 <= server["avg_batch_size"] <= 8.0
    hist_total = sum(b["count"] for b in server["batch_size_histogram"])
    assert hist_total == server["batch_executions"]
    assert server["mean_queue_ms"] is not None and server["mean_compute_ms"] is not None
    # Two counters read by one scrape at each end of the window, with load still running: a
    # batch counts its inferences when it is reported, just before its answers are written, so
    # a batch in flight at a scrape is in one counter and not yet in the other (CI saw 161 vs
    # 162). At most two batches of max 8 straddle the two scrapes.
    assert abs(server["requests_by_outcome"]["success"] - server["inferences"]) <= 2 * 8
    assert server["requests_by_outcome"]["success"] == pytest.approx(run["completed"], rel=0.15)
    # The server says whether it measures energy; when it does not, no figure appears.
    assert server["gpu_telemetry_available"] is not None
    if not server["gpu_telemetry_available"]:
        assert server["energy_per_inference_j"] is None and server["gpu_power_w"] is None
    else:
        assert server["energy_per_inference_j"] > 0
    check_figures_and_html(out, ["poisson 40/s"])


def test_sweeps_json_protocol_and_closed_loop(wattserve: str, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    code = main(
        ["loadgen", "--url", wattserve, "--model", "identity", "--arrival", "constant",
         "--rates", "20,60", "--warmup", "0.5", "--duration", "1", "--json",
         "--max-lag-ms", "100", "--out", str(out), "--no-progress"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((out / "results.json").read_text())
    assert [r["target_rate"] for r in doc["runs"]] == [20.0, 60.0]
    assert [r["sent"] for r in doc["runs"]] == [20, 60]  # constant: exactly rate x window
    assert all(r["target"]["protocol"] == "json" for r in doc["runs"])
    for r in doc["runs"]:
        assert r["achieved_rate"] == pytest.approx(r["target_rate"], rel=0.1)
    assert len(read_csv(out / "summary.csv")) == 2
    check_figures_and_html(out, ["constant 20/s", "constant 60/s"])

    closed = tmp_path / "closed"
    code = main(
        ["loadgen", "--url", wattserve, "--model", "identity", "--arrival", "closed",
         "--concurrencies", "1,4", "--warmup", "0.5", "--duration", "1", "--out", str(closed),
         "--no-progress"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((closed / "results.json").read_text())
    assert [r["concurrency"] for r in doc["runs"]] == [1, 4]
    assert all(r["mode"] == "closed" and r["lag_ms"] is None for r in doc["runs"])
    assert all(r["completed"] > 20 for r in doc["runs"])
    # More workers, more batching on the server.
    assert doc["runs"][1]["server"]["avg_batch_size"] >= doc["runs"][0]["server"]["avg_batch_size"]

"""Triton's Model Analyzer (1.44, remote mode, driving perf_analyzer 2.51) profiles a wattserve
repository model over a small manual search and writes its reports.

Where each behaviour comes from:

- Remote mode loads every candidate configuration through the repository extension with a
  config override (``load`` with a ``config`` parameter holding the JSON ModelConfig): Triton's
  docs/protocol/extension_model_repository.md ("Load", the ``config`` parameter) and Model
  Analyzer's docs/launch_modes.md ("Remote": the server must run in explicit model control mode).
- The manual search (``run_config_search_disable``, ``model_config_parameters``,
  ``parameters.concurrency``) and its exported table: Model Analyzer's docs/config.md and
  docs/config_search.md ("Manual Brute Search").
- perf_analyzer's server-side statistics (each measurement): Triton's
  docs/protocol/extension_statistics.md; ``--collect-metrics`` reads Triton's ``nv_*``
  Prometheus names (docs/user_guide/metrics.md) from ``triton_metrics_url``.

The run is support/model_analyzer_run.py (scripts/model_analyzer_check.sh runs the same thing
by hand; docs/model-analyzer.md shows its YAML). About 40 s here when it completes.
``WATTSERVE_MODEL_ANALYZER`` and ``WATTSERVE_PERF_ANALYZER`` name the tools (.ci/run installs
both); without them the test is skipped, except under CI=true, where it fails.
"""

from __future__ import annotations

import pytest

from support.model_analyzer_run import CONCURRENCIES, MAX_BATCH_SIZES, MODEL, profile
from tests.conformance.external_tools import required_tool

pytestmark = pytest.mark.slow

# Where Model Analyzer stops on wattserve's main, if it does. While PENDING is not empty, a run
# that stops at one of these texts is xfailed; a run that completes, or stops elsewhere, fails
# the test. Empty on main at dc30bc6. (History, issue 22: on fd23329 it stopped at the first
# load, "load with an overriding config is not supported"; with the override but not the
# statistics fix, at "perf_analyzer was terminated by signal: SIGABRT".)
PENDING: tuple[str, ...] = ()


def test_model_analyzer_profiles_a_manual_search(tmp_path):
    model_analyzer = required_tool("WATTSERVE_MODEL_ANALYZER", "scripts/install_model_analyzer.sh")
    perf_analyzer = required_tool("WATTSERVE_PERF_ANALYZER", "scripts/install_perf_analyzer.sh")
    run = profile(model_analyzer, perf_analyzer, tmp_path, timeout_s=300)
    tail = run.output[-4000:]
    if PENDING:
        assert run.returncode != 0, "Model Analyzer completes now: empty PENDING"
        stops = [text for text in PENDING if text in run.output]
        assert stops, f"Model Analyzer stops somewhere PENDING does not name:\n{tail}"
        pytest.xfail(f"issue 22: Model Analyzer stops at: {stops[0]}")
    assert run.returncode == 0, f"model-analyzer exited {run.returncode}:\n{tail}"

    # Model Analyzer always measures the model's own configuration too ("<model>_config_default").
    measured = {(row["Model Config Path"], int(row["Concurrency"])) for row in run.rows}
    variants = {f"{MODEL}_config_{i}" for i in range(len(MAX_BATCH_SIZES))} | {f"{MODEL}_config_default"}
    assert measured == {(v, c) for v in variants for c in CONCURRENCIES}, run.rows
    sizes = {row["Model Config Path"]: int(row["Max Batch Size"]) for row in run.rows}
    assert sorted(sizes[f"{MODEL}_config_{i}"] for i in range(len(MAX_BATCH_SIZES))) == sorted(
        MAX_BATCH_SIZES
    )
    for row in run.rows:
        assert float(row["Throughput (infer/sec)"]) > 0 and float(row["p99 Latency (ms)"]) > 0
    assert run.summary_report.is_file()

    # The server applied the candidates it was sent: the last one is still loaded, with the
    # queue delay the search set (the repository's config.pbtxt sets none).
    assert run.final_config is not None
    assert run.final_config["dynamic_batching"]["max_queue_delay_microseconds"] == 200
    assert run.final_config["max_batch_size"] in MAX_BATCH_SIZES

"""The loadgen command line as a newcomer meets it: options that contradict each other are
refused with one line, and a search shows each step as it finishes even through a pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from wattserve.loadgen.cli import main
from wattserve.server.cli import main as wattserve_main

from tests.servers import ROOT, server_process

BASE = ["loadgen", "--url", "http://127.0.0.1:9", "--model", "identity"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--slo-ms", "50", "--rates", "100,200"], "--slo-ms searches for the rate itself"),
        (["--slo-ms", "50", "--arrival", "closed"], "--arrival closed"),
        (["--slo-ms", "50", "--arrival", "trace", "--trace", "t.txt"], "trace"),
        (["--search-start", "100", "--rate", "10"], "give --slo-ms too"),
        (["--rate", "10", "--rates", "1,2"], "--rate and --rates"),
        (["--arrival", "closed", "--rates", "1,2"], "--arrival closed runs at a concurrency"),
        (["--concurrencies", "1,2"], "--concurrencies is for --arrival closed"),
    ],
)
@pytest.mark.parametrize("entry", [main, wattserve_main], ids=["python -m wattserve.loadgen", "wattserve"])
def test_conflicting_options_are_refused_with_one_line(entry, extra, words, capsys) -> None:
    # Port 9 (discard) has no server: a refusal must come before any connection is tried.
    with pytest.raises(SystemExit) as exc:
        entry([*BASE, *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and words in error_lines[0], err
    assert "Traceback" not in err


def test_options_that_agree_still_parse() -> None:
    from wattserve.loadgen.cli import conflicting_options
    from wattserve.server.cli import build_parser

    for extra in (
        ["--slo-ms", "50", "--rate", "100"],  # --rate is the search's first rate
        ["--slo-ms", "50", "--search-start", "100"],
        ["--rates", "1,2"],
        ["--arrival", "closed", "--concurrencies", "1,4"],
    ):
        args = build_parser().parse_args([*BASE, *extra])
        assert conflicting_options(args) is None, extra


@pytest.fixture(scope="module")
def identity_url():
    env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_LOG_LEVEL": "warning"}
    with server_process(env) as proc:
        yield proc.url


@pytest.mark.slow
def test_search_prints_each_step_as_it_finishes_through_a_pipe(identity_url: str, tmp_path: Path) -> None:
    """stderr is a pipe (not a TTY): the probe and every step arrive while the search runs."""
    out = tmp_path / "search"
    command = [
        sys.executable, "-m", "wattserve.loadgen", "loadgen", "--url", identity_url,
        "--model", "identity", "--slo-ms", "200", "--percentile", "90", "--min-queries", "40",
        "--warmup", "0.2", "--duration", "0.6", "--search-steps", "3", "--max-lag-ms", "100",
        "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    seen_while_running: list[str] = []
    lines: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if proc.poll() is None and (line.startswith("step ") or line.startswith("probe:")):
            seen_while_running.append(line)
    assert proc.wait(timeout=120) == 0, "".join(lines)
    text = "".join(lines)
    # No --search-start: a short closed-loop probe picks the first rate, and says so.
    assert any(line.startswith("probe: closed loop") for line in lines), text
    steps = [line for line in lines if line.startswith("step ")]
    doc = json.loads((out / "results.json").read_text())
    assert len(steps) == len(doc["search"]["steps"]) == 3, text
    assert steps[0].startswith("step 1/3") and ("PASS" in steps[0] or "fail" in steps[0])
    # The first step's line came out before the process ended (step 2 and 3 were still to run).
    assert any(line.startswith("step 1/3") for line in seen_while_running), text
    assert any(line.startswith("probe:") for line in seen_while_running), text
    assert doc["search_probe"]["start_rate"] == doc["search"]["steps"][0]["rate"]

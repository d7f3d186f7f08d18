"""benchmarks/repository_load_report.py: which models a repository loads, and why not the rest.

It is the tool behind issue 22's "loads N of M models" figure, so its counting and grouping
must be right: a model counts as loaded if any version is READY, and failures that differ only
in names, paths and numbers fall into one group.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.repository_load_report import main, reason_key, summarize
from loadgen.server_process import free_port
from support.model_repository import make_repository


def test_reason_key_folds_names_paths_and_numbers():
    a = "/r/onnx_a/config.pbtxt: input[0] (INPUT0) dims [-1]: variable dimensions (-1) are not supported"
    b = "/r/libtorch_b/config.pbtxt: input[1] (INPUT__1) dims [2, -1]: variable dimensions (-1) are not supported"
    assert reason_key(a) == reason_key(b)
    assert reason_key(a) != reason_key(
        "/r/x/config.pbtxt: input[0] (INPUT0) data_type TYPE_STRING is not supported"
    )


def test_summarize_counts_models_not_versions():
    index = [
        {"name": "m1", "version": "1", "state": "READY"},
        {"name": "m1", "version": "2", "state": "UNAVAILABLE", "reason": "x"},
        {"name": "m2", "version": "1", "state": "UNAVAILABLE", "reason": "tensor 'A' has unsupported type"},
        {"name": "m3", "version": "1", "state": "UNAVAILABLE", "reason": "tensor 'B' has unsupported type"},
        {"name": "m4", "state": "UNAVAILABLE", "reason": ""},
    ]
    s = summarize(index)
    assert (s["models"], s["loaded"], s["loaded_models"]) == (4, 1, ["m1"])
    assert [(g["count"], g["models"]) for g in s["failures"]] == [(2, ["m2", "m3"]), (1, ["m4"])]
    assert s["failures"][1]["example_reason"] == "(no reason given)"


def test_reports_a_real_repository(tmp_path, capsys):
    repo = make_repository(tmp_path / "repo")
    out = tmp_path / "report.json"
    argv = [
        str(repo),
        "--python",
        sys.executable,
        "--port",
        str(free_port()),
        "--out",
        str(out),
        "--timeout-s",
        "120",
    ]
    argv += ["--root", str(Path(__file__).resolve().parents[1])]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["models"] == 4 and report["loaded"] == 3
    assert [g["models"] for g in report["failures"]] == [["broken"]]
    assert "loaded 3 of 4 models" in capsys.readouterr().out

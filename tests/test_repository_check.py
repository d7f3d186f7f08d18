"""``wattserve repository check``: which models a repository loads, and why not the rest.

It is the tool behind the "loads N of M models" figures, so its counting and grouping must be
right: a model counts as loaded if any version is READY, and failures that differ only in
names, paths and numbers fall into one group. Its exit status says whether all loaded.
"""

from __future__ import annotations

import json

from wattserve.loadgen.repository_check import reason_key, summarize
from wattserve.server.cli import main

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
    argv = ["repository", "check", str(repo), "--json", str(out), "--timeout-s", "120"]
    assert main(argv) == 1, "one model of four does not load: the exit status says so"
    report = json.loads(out.read_text())
    assert report["models"] == 4 and report["loaded"] == 3
    assert [g["models"] for g in report["failures"]] == [["broken"]]
    assert "loaded 3 of 4 models" in capsys.readouterr().out


def test_a_repository_that_loads_whole_exits_zero(tmp_path, capsys):
    repo = make_repository(tmp_path / "repo", broken=False)
    assert main(["repository", "check", str(repo), "--timeout-s", "120"]) == 0
    assert "loaded 3 of 3 models" in capsys.readouterr().out


def test_a_server_that_does_not_start_exits_two(tmp_path, capsys):
    missing = tmp_path / "no_such_repository"
    assert main(["repository", "check", str(missing), "--timeout-s", "60"]) == 2
    assert "did not come up" in capsys.readouterr().err

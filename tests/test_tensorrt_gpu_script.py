"""scripts/gpu_engines_check.py without a GPU: it refuses clearly, and its TensorRT part runs
end to end against FakeTensorRT/FakePycuda (test doubles), so the one GPU call we may get is
not wasted on a typo."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from support.doubles import fake_tensorrt

ROOT = Path(__file__).resolve().parent.parent
RNG = np.random.default_rng(5)
W = RNG.standard_normal((3, 1000)).astype(np.float32)
B = RNG.standard_normal(1000).astype(np.float32)


@pytest.fixture
def script():
    spec = importlib.util.spec_from_file_location(
        "gpu_engines_check", ROOT / "scripts" / "gpu_engines_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def image_onnx(tmp_path):
    """input [batch,3,224,224] -> logits [batch,1000] = mean over H,W @ W + B."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])
    nodes = [
        helper.make_node("ReduceMean", ["input", "axes"], ["pooled"], keepdims=0),
        helper.make_node("Gemm", ["pooled", "W", "B"], ["logits"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
        numpy_helper.from_array(W, "W"),
        numpy_helper.from_array(B, "B"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "img", [x], [y], initializer=inits),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    model.ir_version = 8
    path = tmp_path / "img.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_without_cuda_it_exits_2_and_says_so(script, tmp_path, capsys):
    assert script.main(["--out-dir", str(tmp_path)]) == 2
    assert "needs a GPU" in capsys.readouterr().out
    doc = json.loads((tmp_path / "gpu_engines_check.json").read_text())
    assert "needs a GPU" in doc["error"]
    assert "tensorrt" in doc["environment"]


def test_without_tensorrt_it_says_so_plainly(script, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorrt", None)
    report = script.Report()
    script.check_tensorrt("m", argparse.Namespace(), report, {}, {})
    assert report.notes and "TensorRT is NOT importable" in report.notes[0]
    assert not report.failures


def test_tensorrt_part_runs_end_to_end_on_the_doubles(script, monkeypatch, image_onnx, tmp_path):
    fake_tensorrt.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU (test double)")
    monkeypatch.setattr(script, "onnx_file", lambda model, args: image_onnx)
    args = argparse.Namespace(
        batch_sizes=[1, 4],
        off_bucket=3,
        profiles="1:1:1,4:4:4",
        precisions=["fp16", "fp32"],
        min_iters=2,
        min_seconds=0.0,
        cache_dir=tmp_path / "cache",
    )
    refs = {}
    for b in (1, 3, 4):
        x = script.batch_for(b)["input"]
        refs[b] = x.mean(axis=(2, 3)) @ W + B
    report = script.Report()
    script.check_tensorrt("img", args, report, {}, refs)
    assert report.failures == []
    builds = [r for r in report.rows if r["engine"] == "tensorrt build"]
    assert [(r["precision"], r["built"], r["cache_hit_second_time"]) for r in builds] == [
        ("fp16", True, True),
        ("fp32", True, True),
    ]
    runs = [r for r in report.rows if "batch_size" in r]
    assert len(runs) == 6
    assert all(r["rel_diff"] < 1e-5 and r["top1_agreement"] == 1.0 for r in runs)
    assert any("(pad to 4)" in r["engine"] for r in runs if r["batch_size"] == 3)
    script.print_table(report.rows)

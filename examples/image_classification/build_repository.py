"""Write the classifier's ONNX file into the example's model repository (or a copy of it).

The classifier is a tiny CNN with random weights (seeded), built with onnx.helper in well
under a second: two strided 3x3 convolutions, global average pooling, a linear layer to 10
classes; input PIXELS [batch, 3, 64, 64], output LOGITS [batch, 10]. Its labels mean
nothing; the pipeline around it is the point.

    python examples/image_classification/build_repository.py [--out DIR]

Without --out the files go into examples/image_classification/model_repository (ignored by
git); with it, the repository is copied to DIR first.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent / "model_repository"
CLASSES = 10


def classifier(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        values = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
        return numpy_helper.from_array(values, name)

    initializers = [
        weight("w1", 16, 3, 3, 3), numpy_helper.from_array(np.zeros(16, np.float32), "b1"),
        weight("w2", 32, 16, 3, 3), numpy_helper.from_array(np.zeros(32, np.float32), "b2"),
        weight("w3", 32, CLASSES), numpy_helper.from_array(np.zeros(CLASSES, np.float32), "b3"),
    ]  # fmt: skip
    conv = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("Conv", ["PIXELS", "w1", "b1"], ["c1"], **conv),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], **conv),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["LOGITS"]),
    ]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("PIXELS", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [helper.make_tensor_value_info("LOGITS", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=initializers,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def build(out: Path | None = None) -> Path:
    """The repository ready to serve: at ``out`` (a copy) or in place; returns its path."""
    root = HERE
    if out is not None:
        shutil.copytree(HERE, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
        root = out
    model = classifier()
    for name in ("classifier", "image_classifier_python"):  # the baseline runs the same file
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
    (root / "image_classifier" / "1").mkdir(exist_ok=True)  # Triton wants the ensemble's version folder
    return root


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="copy the repository here first")
    print(build(parser.parse_args().out))

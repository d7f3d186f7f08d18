"""A Triton-layout model repository made from real models, for tests and benchmarks.

A small torchvision classifier (squeezenet1_1, 10 classes, 64x64 inputs, random weights
from a seed) is exported to ONNX and TorchScript, so the two file platforms serve the same
network; a built-in identity sits beside them.
"""

from __future__ import annotations

from pathlib import Path

import torch

IMAGE = (3, 64, 64)
CLASSES = 10


def small_classifier(seed: int = 0) -> torch.nn.Module:
    import torchvision  # here: test files import this module, and xdist workers collect them all

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torchvision.models.squeezenet1_1(num_classes=CLASSES).eval()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def export_onnx(model: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(model, (torch.randn(2, *IMAGE),), str(path), input_names=["image"],
                          output_names=["scores"], dynamic_axes={"image": {0: "n"}, "scores": {0: "n"}},
                          opset_version=17, dynamo=False)  # fmt: skip


def export_torchscript(model: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.jit.trace(model, torch.randn(2, *IMAGE)).save(str(path))


ONNX_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
# inputs and outputs omitted: read from model.onnx
dynamic_batching { max_queue_delay_microseconds: 2000 preferred_batch_size: [ 4 ] }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

TORCHSCRIPT_CONFIG = """
name: "squeeze_ts"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "batcher" value: { string_value: "continuous" } }
"""

IDENTITY_CONFIG = """
backend: "wattserve"
max_batch_size: 16
dynamic_batching { }
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "16" } }
"""


def make_repository(root: Path, *, broken: bool = True, identity_delay_ms: float = 0.0) -> Path:
    """squeeze_onnx (ONNX Runtime), squeeze_ts (TorchScript), identity (built-in), and
    ``broken`` (a good config over a corrupt model.onnx) when asked."""
    model = small_classifier()
    export_onnx(model, root / "squeeze_onnx" / "1" / "model.onnx")
    write(root / "squeeze_onnx" / "config.pbtxt", ONNX_CONFIG)
    export_torchscript(model, root / "squeeze_ts" / "1" / "model.pt")
    write(root / "squeeze_ts" / "config.pbtxt", TORCHSCRIPT_CONFIG)
    identity = IDENTITY_CONFIG
    if identity_delay_ms:
        identity += (
            f'parameters {{ key: "identity_delay_ms" value: {{ string_value: "{identity_delay_ms}" }} }}\n'
        )
    write(root / "identity" / "config.pbtxt", identity)
    if broken:
        # the config is fine, the model file is not: loading fails, with the reason
        write(root / "broken" / "config.pbtxt", 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n')
        write(root / "broken" / "1" / "model.onnx", "not an ONNX file")
    return root

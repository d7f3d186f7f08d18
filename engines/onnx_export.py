"""Export a served torchvision model to ONNX with a dynamic batch axis.

The ONNX file feeds the ONNX Runtime and TensorRT engines. It must compute what the torch
engine computes, for every batch size, so the export is checked with onnx's checker and its
outputs compared with torch's before it is trusted.

Exporter: torch's default (``dynamo=True``, torch.export-based, needs onnxscript) at opset 18.
It folds BatchNorm into the convolutions and gives a clean graph; measured here it agrees with
torch to ~1e-5 relative on mobilenet_v2/resnet50. It takes ~8-12 s for mobilenet_v2 on this
CPU against ~0.5 s for the legacy TorchScript exporter, but exports are cached, and the legacy one
is deprecated; ``legacy=True`` (opset 17) remains for old TensorRT parsers.

The command line (``wattserve export``) is in ``server/engine_commands.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from wattserve.engines.base import EngineUnavailable
from wattserve.engines.catalog import TORCHVISION_MODELS
from wattserve.engines.config import EngineConfig

log = logging.getLogger(__name__)

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
IMAGE_SHAPE = (3, 224, 224)
DYNAMO_OPSET = 18
LEGACY_OPSET = 17
# Logit scales differ by model and weights (uncalibrated random mobilenet_v2 gave ~1e-9), so
# agreement is judged relative to the output's own scale: max|onnx - torch| / max|torch|.
DEFAULT_RTOL = 1e-4


def build_torchvision_model(name: str, seed: int = 0, weights: str | None = None):
    """The torch model the torch engine serves (same loader, so the same weights), in eval mode.

    Random weights from ``seed`` unless ``weights`` names a local state dict (or 'pretrained').
    """
    from wattserve.engines.torch_engine import load_torchvision_model

    if name not in TORCHVISION_MODELS:
        raise EngineUnavailable(f"ONNX export supports {', '.join(TORCHVISION_MODELS)}; not {name!r}")
    return load_torchvision_model(name, weights, seed).eval()


def recipe_digest(model: str, seed: int, weights: str | None = None) -> str:
    """A short digest of everything that decides the torch model's weights, computed
    without building it: name, seed, the weights file's bytes, torch/torchvision versions
    and the torch engine's loader source (random-weight calibration lives there). A cached
    export from another recipe is never reused; building resnet50 just to hash its weights
    would cost ~13 s at every start on this CPU.
    """
    import inspect

    import torch
    import torchvision
    from wattserve.engines import torch_engine

    if weights and weights != "pretrained":
        from wattserve.engines.profiles import file_sha256

        weights = file_sha256(weights)
    recipe = {
        "model": model,
        "seed": seed,
        "weights": weights,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "loader": hashlib.sha256(inspect.getsource(torch_engine).encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def default_onnx_path(
    cache_dir: str | Path, model: str, seed: int, legacy: bool = False, weights: str | None = None
) -> Path:
    """Where an exported model lives in the cache; the name says what it was built from."""
    opset = LEGACY_OPSET if legacy else DYNAMO_OPSET
    return Path(cache_dir) / f"{model}-{recipe_digest(model, seed, weights)}-opset{opset}.onnx"


def export_onnx(model, path: str | Path, *, legacy: bool = False, max_batch: int = 1024) -> Path:
    """Export ``model`` (image classifier) to ``path`` with a dynamic batch axis, atomically.

    Written to a temporary file in the same folder and renamed, so a crash or a concurrent
    reader never sees half a file.
    """
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    example = torch.randn(2, *IMAGE_SHAPE)
    fd, tmp_name = tempfile.mkstemp(suffix=".onnx", prefix=".export-", dir=path.parent)
    os.close(fd)
    try:
        with torch.inference_mode(False), torch.no_grad():
            if legacy:
                torch.onnx.export(
                    model,
                    (example,),
                    tmp_name,
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                    opset_version=LEGACY_OPSET,
                    dynamo=False,
                )
            else:
                batch = torch.export.Dim("batch", min=1, max=max_batch)
                program = torch.onnx.export(
                    model,
                    (example,),
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    dynamic_shapes=({0: batch},),
                    opset_version=DYNAMO_OPSET,
                    dynamo=True,
                    optimize=True,
                    verbose=False,
                )
                if program is None:  # only dynamo=False returns None; typed for both
                    raise EngineUnavailable("torch.onnx.export(dynamo=True) returned no ONNX program")
                program.save(tmp_name)
        check_onnx(tmp_name)
        os.replace(tmp_name, path)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return path


def check_onnx(path: str | Path) -> None:
    """onnx's checker plus the contract the engines rely on: names and a dynamic batch axis."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)
    graph = onnx.load(str(path), load_external_data=False).graph
    inputs = {i.name: i for i in graph.input}
    outputs = {o.name: o for o in graph.output}
    if INPUT_NAME not in inputs or OUTPUT_NAME not in outputs:
        raise ValueError(
            f"{path}: expected input {INPUT_NAME!r} and output {OUTPUT_NAME!r}, "
            f"found {list(inputs)} -> {list(outputs)}"
        )
    for tensor in (inputs[INPUT_NAME], outputs[OUTPUT_NAME]):
        dim0 = tensor.type.tensor_type.shape.dim[0]
        if dim0.HasField("dim_value"):
            raise ValueError(f"{path}: {tensor.name} has a fixed batch of {dim0.dim_value}")


@dataclass(frozen=True)
class Agreement:
    """How far ONNX Runtime's outputs are from torch's at one batch size."""

    batch_size: int
    max_abs_diff: float
    max_abs_ref: float

    @property
    def rel_diff(self) -> float:
        return self.max_abs_diff / max(self.max_abs_ref, float(np.finfo(np.float32).tiny))


def compare_with_torch(
    model, onnx_path: str | Path, batch_sizes: Sequence[int], seed: int = 1
) -> list[Agreement]:
    """Run torch and ONNX Runtime (CPU) on the same random batches; report the differences."""
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    report = []
    for b in batch_sizes:
        x = rng.standard_normal((b, *IMAGE_SHAPE), dtype=np.float32)
        with torch.inference_mode():
            ref = model(torch.from_numpy(x)).numpy()
        (got,) = session.run([OUTPUT_NAME], {INPUT_NAME: x})
        if got.shape != ref.shape:
            raise ValueError(f"batch {b}: onnx shape {got.shape} != torch {ref.shape}")
        report.append(Agreement(b, float(np.abs(got - ref).max()), float(np.abs(ref).max())))
    return report


def ensure_onnx(config: EngineConfig) -> Path:
    """The ONNX file for ``config.model``: ``config.onnx_path`` if given, else the cached
    export (exported and verified on first use)."""
    if config.onnx_path is not None:
        path = Path(config.onnx_path)
        if not path.exists():
            raise EngineUnavailable(f"onnx_path {path} does not exist")
        return path
    path = default_onnx_path(config.cache_dir, config.model, config.seed, weights=config.weights)
    if path.exists():
        return path
    log.info("exporting %s to %s", config.model, path)
    model = build_torchvision_model(config.model, config.seed, config.weights)
    export_onnx(model, path)
    worst = max(compare_with_torch(model, path, [1, 3]), key=lambda a: a.rel_diff)
    if worst.rel_diff > DEFAULT_RTOL:
        path.unlink()
        raise EngineUnavailable(
            f"exported {config.model} disagrees with torch: relative diff {worst.rel_diff:.2e}"
        )
    return path

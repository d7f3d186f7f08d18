"""PyTorch engine for torchvision classifiers (resnet50, mobilenet_v2, mobilenet_v3_large).

Random weights come from a fixed seed so that two servers given the same input agree;
``weights`` loads a local state dict, or torchvision's published weights when the user
asks for 'pretrained' (a download, so never the default).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from wattserve.engines.base import Batch, EngineError, TensorSpec
from wattserve.engines.catalog import TORCHVISION_MODELS

log = logging.getLogger("wattserve.engines.torch")

IMAGE_SPEC = TensorSpec("input", (3, 224, 224), "FP32")
LOGITS_SPEC = TensorSpec("logits", (1000,), "FP32")


def resolve_device(requested: str) -> torch.device:
    """'auto' -> first CUDA device if torch sees one, else CPU."""
    if requested == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {requested!r} asked for, but torch sees no CUDA device")
    return device


def load_torchvision_model(name: str, weights: str | None, seed: int) -> torch.nn.Module:
    """Build ``name``; random weights from ``seed`` unless ``weights`` says otherwise."""
    if name not in TORCHVISION_MODELS:
        raise ValueError(f"unknown torchvision model {name!r}; known: {TORCHVISION_MODELS}")
    import torchvision  # here, not at import: a second of CPU every process importing this module paid

    if weights == "pretrained":
        return torchvision.models.get_model(name, weights="DEFAULT")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torchvision.models.get_model(name, weights=None)
    if weights:
        model.load_state_dict(_read_state_dict(Path(weights)))
        log.info("loaded weights from %s", weights)
    else:
        calibrate_batchnorm(model, seed)
    return model


def calibrate_batchnorm(model: torch.nn.Module, seed: int, batches: int = 2, size: int = 8) -> None:
    """Give random weights realistic activations: set BatchNorm statistics from seeded noise.

    Freshly initialised torchvision nets have unit running variance everywhere, so
    activations shrink layer after layer (mobilenet_v2 logits come out near 1e-9, where
    "same answer" tests mean nothing and denormals can slow CPUs). A deterministic
    data-dependent pass fixes the scale without any download.
    """
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the calibration batches
    generator = torch.Generator().manual_seed(seed)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(size, 3, 224, 224, generator=generator))
    for m, momentum in zip(norms, momenta, strict=True):
        m.momentum = momentum
    model.eval()


def fold_batchnorm(model: torch.nn.Module) -> torch.nn.Module:
    """The same network with each eval-mode BatchNorm folded into the convolution before it.

    At inference a BatchNorm is a per-channel affine map, so it can live in the conv's weights
    and bias: one fewer pass over every activation (measured in the README's performance
    section). torch.fx traces the model to find conv -> bn pairs; a model it cannot trace is
    served as it is.
    """
    from torch.fx.experimental.optimization import fuse

    try:
        return fuse(model)
    except Exception as exc:  # tracing is best effort: control flow on tensors, odd modules
        log.warning("BatchNorm not folded (%s: %s); serving the model unchanged", type(exc).__name__, exc)
        return model


def _read_state_dict(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} does not exist")
    obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "model_state_dict"):  # common checkpoint wrappers
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds {type(obj).__name__}, not a state dict")
    return {k.removeprefix("module."): v for k, v in obj.items()}


class TorchVisionEngine:
    """A torchvision classifier in inference mode; blocking, one caller thread."""

    platform = "pytorch"

    def __init__(
        self,
        model_name: str,
        *,
        device: str = "auto",
        weights: str | None = None,
        seed: int = 0,
        fp16: bool = False,
        channels_last: bool = True,
        fuse_conv_bn: bool = True,
        max_batch_size: int = 32,
        threads: int | None = None,
    ) -> None:
        self.name = model_name
        self.inputs = [IMAGE_SPEC]
        self.outputs = [LOGITS_SPEC]
        self.max_batch_size = max_batch_size
        self.batch_sizes: list[int] | None = None
        self._device = resolve_device(device)
        self.device = str(self._device)
        if threads is not None and self._device.type == "cpu":
            torch.set_num_threads(threads)
        self._half = fp16 and self._device.type == "cuda"
        self._channels_last = channels_last
        model = load_torchvision_model(model_name, weights, seed).eval()
        if fuse_conv_bn:
            model = fold_batchnorm(model)
        model = model.to(self._device)
        if self._channels_last:
            model = model.to(memory_format=torch.channels_last)
        if self._half:
            model = model.half()
        self.model = model

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        x = torch.from_numpy(np.ascontiguousarray(batch["input"]))
        with torch.inference_mode():
            x = x.to(self._device, non_blocking=True)
            if self._half:
                x = x.half()
            if self._channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            logits = self.model(x)
            out = logits.float().cpu().numpy()  # .cpu() synchronizes on CUDA
        return {"logits": out}

    def close(self) -> None:
        # Drop the weights. No call follows close() (the Engine contract), so the attribute
        # keeps the live model's type rather than an Optional every infer() must test.
        self.model = None  # type: ignore[assignment]
        if self._device.type == "cuda":
            torch.cuda.empty_cache()

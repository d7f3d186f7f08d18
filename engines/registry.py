"""Built-in models and engines, each found by name in one table: ``MODELS`` and ``ENGINES``.

``build_engine(settings)`` looks ``settings.model`` up in ``MODELS`` and ``settings.engine``
up in ``ENGINES``. The torchvision names ``MODELS`` uses live in engines/catalog.py, which the
engine modules import instead of this one (no import cycle). The engine modules are imported
only when one is built (torch alone takes seconds to import).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from wattserve.engines.base import Engine
from wattserve.engines.catalog import TORCHVISION_MODELS
from wattserve.engines.identity import IdentityEngine

EngineBuilder = Callable[[Any], Engine]  # settings (server.settings.Settings) -> one engine instance


@dataclass(frozen=True)
class BuiltinModel:
    """A model wattserve serves without a model file.

    ``build`` makes it for the torch engine. ``any_engine``: it needs no framework (identity),
    so ``build`` serves it whatever ``WATTSERVE_ENGINE`` names.
    """

    build: EngineBuilder
    any_engine: bool = False


def _identity(settings: Any) -> Engine:
    return IdentityEngine(
        settings.identity_elements,
        max_batch_size=settings.max_batch_size,
        delay_s=settings.identity_delay_ms / 1000.0,
        delay_per_item_s=settings.identity_delay_per_item_ms / 1000.0,
    )


def _diffusion(settings: Any) -> Engine:
    from wattserve.engines.diffusion import DiffusionEngine

    return DiffusionEngine(
        settings.model,
        model_path=settings.diffusion_model,  # unset: the tiny UNet with random weights
        scheduler=settings.diffusion_scheduler,
        device=settings.device,
        seed=settings.seed,
        fp16=settings.fp16,
        max_batch_size=settings.max_batch_size,
        default_steps=settings.diffusion_default_steps,
        threads=settings.torch_threads,
    )


def _text_to_image(settings: Any) -> Engine:
    """A local Stable Diffusion folder (WATTSERVE_DIFFUSION_MODEL); nothing is downloaded."""
    from wattserve.engines.text_to_image import TextToImageEngine

    if settings.diffusion_model is None:
        raise ValueError(
            f"model {settings.model!r} needs WATTSERVE_DIFFUSION_MODEL=<a local Stable Diffusion folder>"
        )
    return TextToImageEngine(
        settings.model,
        settings.diffusion_model,
        scheduler=settings.diffusion_scheduler,
        device=settings.device,
        fp16=settings.fp16,
        max_batch_size=settings.max_batch_size,
        default_steps=settings.diffusion_default_steps,
        threads=settings.torch_threads,
    )


def _torchvision(settings: Any) -> Engine:
    from wattserve.engines.torch_engine import TorchVisionEngine

    engine = TorchVisionEngine(
        settings.model,
        device=settings.device,
        weights=settings.weights,
        seed=settings.seed,
        fp16=settings.fp16,
        channels_last=settings.channels_last,
        fuse_conv_bn=settings.fuse_conv_bn,
        max_batch_size=settings.max_batch_size,
        threads=settings.torch_threads,
    )
    if settings.cuda_graphs:
        from wattserve.engines.cuda_graphs import CudaGraphEngine

        return CudaGraphEngine.from_settings(engine, settings)
    return engine


MODELS: Mapping[str, BuiltinModel] = {
    "identity": BuiltinModel(_identity, any_engine=True),
    **{name: BuiltinModel(_torchvision) for name in TORCHVISION_MODELS},
    "tiny_unet": BuiltinModel(_diffusion),
    "stable_diffusion": BuiltinModel(_text_to_image),
}


def _torch(settings: Any) -> Engine:
    model = MODELS.get(settings.model)
    if model is None:
        raise ValueError(f"no torch engine for model {settings.model!r}; models: {', '.join(MODELS)}")
    return model.build(settings)


def _onnxruntime(settings: Any) -> Engine:
    """``settings.onnx_path`` (any model name), else the checked export of a torchvision model."""
    from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine

    return OnnxRuntimeEngine.from_settings(settings)


def _tensorrt(settings: Any) -> Engine:
    """A plan built from the same ONNX file the ONNX Runtime engine would run."""
    from wattserve.engines.tensorrt_engine import TensorRTEngine

    return TensorRTEngine.from_settings(settings)


ENGINES: Mapping[str, EngineBuilder] = {
    "torch": _torch,
    "onnxruntime": _onnxruntime,
    "tensorrt": _tensorrt,
}


def build_engine(settings: Any) -> Engine:
    """One engine instance for ``settings`` (server.settings.Settings)."""
    model = MODELS.get(settings.model)
    if model is not None and model.any_engine:
        return model.build(settings)
    engine = ENGINES.get(settings.engine)
    if engine is None:
        raise ValueError(f"no engine named {settings.engine!r}; engines: {', '.join(ENGINES)}")
    return engine(settings)

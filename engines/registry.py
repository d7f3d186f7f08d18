"""Build the engine the settings name. The one place that knows every model and engine."""

from __future__ import annotations

from typing import Any

from wattserve.engines.base import Engine
from wattserve.engines.identity import IdentityEngine

MODELS = ("identity", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "tiny_unet")


def build_engine(settings: Any) -> Engine:
    """One engine instance for ``settings`` (server.settings.Settings)."""
    model = settings.model
    if model == "identity":
        return IdentityEngine(
            settings.identity_elements,
            max_batch_size=settings.max_batch_size,
            delay_s=settings.identity_delay_ms / 1000.0,
            delay_per_item_s=settings.identity_delay_per_item_ms / 1000.0,
        )
    if model == "tiny_unet" and settings.engine == "torch":
        from wattserve.engines.diffusion import DiffusionEngine

        return DiffusionEngine(
            model,
            model_path=settings.diffusion_model,  # unset: the tiny UNet with random weights
            scheduler=settings.diffusion_scheduler,
            device=settings.device,
            seed=settings.seed,
            fp16=settings.fp16,
            max_batch_size=settings.max_batch_size,
            default_steps=settings.diffusion_default_steps,
            threads=settings.torch_threads,
        )
    if settings.engine == "torch":
        from wattserve.engines.torch_engine import TORCHVISION_MODELS, TorchVisionEngine

        if model in TORCHVISION_MODELS:
            engine = TorchVisionEngine(
                model,
                device=settings.device,
                weights=settings.weights,
                seed=settings.seed,
                fp16=settings.fp16,
                channels_last=settings.channels_last,
                max_batch_size=settings.max_batch_size,
                threads=settings.torch_threads,
            )
            if settings.cuda_graphs:
                from wattserve.engines.cuda_graphs import CudaGraphEngine

                return CudaGraphEngine.from_settings(engine, settings)
            return engine
    if settings.engine == "onnxruntime":
        from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine

        return OnnxRuntimeEngine.from_settings(settings)
    if settings.engine == "tensorrt":
        from wattserve.engines.tensorrt_engine import TensorRTEngine

        return TensorRTEngine.from_settings(settings)
    raise ValueError(f"no {settings.engine} engine for model {model!r}; models: {', '.join(MODELS)}")

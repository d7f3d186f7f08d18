"""Built-in models and engines, each found by name in one table: ``MODELS`` and ``ENGINES``.

``build_engine(config)`` looks ``config.model`` up in ``MODELS`` and ``config.engine`` up in
``ENGINES`` (``config``: the engine part of a model's configuration, engines/config.py). The
names both tables use live in engines/catalog.py, which the engine modules and the server
settings import instead of this one (no import cycle). The engine modules are imported only
when one is built (torch alone takes seconds to import).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from wattserve.engines.base import Engine
from wattserve.engines.catalog import BUILTIN_MODELS, DIFFUSION_MODELS, ENGINE_NAMES, TORCHVISION_MODELS
from wattserve.engines.config import EngineConfig
from wattserve.engines.identity import IdentityEngine

EngineBuilder = Callable[[EngineConfig], Engine]  # one engine instance


@dataclass(frozen=True)
class BuiltinModel:
    """A model wattserve serves without a model file.

    ``build`` makes it for the torch engine. ``any_engine``: it needs no framework (identity),
    so ``build`` serves it whatever ``WATTSERVE_ENGINE`` names.
    """

    build: EngineBuilder
    any_engine: bool = False
    steps: bool = False  # a step engine (engines.base.StepEngine): iteration-level batching


def _identity(config: EngineConfig) -> Engine:
    return IdentityEngine(
        config.identity_elements,
        max_batch_size=config.max_batch_size,
        delay_s=config.identity_delay_ms / 1000.0,
        delay_per_item_s=config.identity_delay_per_item_ms / 1000.0,
    )


def _diffusion(config: EngineConfig) -> Engine:
    from wattserve.engines.diffusion import DiffusionEngine

    return DiffusionEngine(
        config.model,
        model_path=config.diffusion_model,  # unset: the tiny UNet with random weights
        scheduler=config.diffusion_scheduler,
        device=config.device,
        seed=config.seed,
        fp16=config.fp16,
        max_batch_size=config.max_batch_size,
        default_steps=config.diffusion_default_steps,
        threads=config.torch_threads,
    )


def _text_to_image(config: EngineConfig) -> Engine:
    """A local Stable Diffusion folder (WATTSERVE_DIFFUSION_MODEL); nothing is downloaded."""
    from wattserve.engines.text_to_image import TextToImageEngine

    if config.diffusion_model is None:
        raise ValueError(
            f"model {config.model!r} needs WATTSERVE_DIFFUSION_MODEL=<a local Stable Diffusion folder>"
        )
    return TextToImageEngine(
        config.model,
        config.diffusion_model,
        scheduler=config.diffusion_scheduler,
        device=config.device,
        fp16=config.fp16,
        max_batch_size=config.max_batch_size,
        default_steps=config.diffusion_default_steps,
        threads=config.torch_threads,
    )


def _torchvision(config: EngineConfig) -> Engine:
    from wattserve.engines.torch_engine import TorchVisionEngine

    engine = TorchVisionEngine(
        config.model,
        device=config.device,
        weights=config.weights,
        seed=config.seed,
        fp16=config.fp16,
        channels_last=config.channels_last,
        fuse_conv_bn=config.fuse_conv_bn,
        max_batch_size=config.max_batch_size,
        threads=config.torch_threads,
    )
    if config.cuda_graphs:
        from wattserve.engines.cuda_graphs import CudaGraphEngine

        return CudaGraphEngine.from_config(engine, config)
    return engine


MODELS: Mapping[str, BuiltinModel] = {
    "identity": BuiltinModel(_identity, any_engine=True),
    **{name: BuiltinModel(_torchvision) for name in TORCHVISION_MODELS},
    "tiny_unet": BuiltinModel(_diffusion, steps=True),
    "stable_diffusion": BuiltinModel(_text_to_image, steps=True),
}


def _torch(config: EngineConfig) -> Engine:
    model = MODELS.get(config.model)
    if model is None:
        raise ValueError(f"no torch engine for model {config.model!r}; models: {', '.join(MODELS)}")
    return model.build(config)


def _onnxruntime(config: EngineConfig) -> Engine:
    """``config.onnx_path`` (any model name), else the checked export of a torchvision model."""
    from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine

    return OnnxRuntimeEngine.from_config(config)


def _tensorrt(config: EngineConfig) -> Engine:
    """A plan built from the same ONNX file the ONNX Runtime engine would run."""
    from wattserve.engines.tensorrt_engine import TensorRTEngine

    return TensorRTEngine.from_config(config)


ENGINES: Mapping[str, EngineBuilder] = {
    "torch": _torch,
    "onnxruntime": _onnxruntime,
    "tensorrt": _tensorrt,
}
assert tuple(MODELS) == BUILTIN_MODELS and tuple(ENGINES) == ENGINE_NAMES, "engines/catalog.py names them"
assert {n for n, m in MODELS.items() if m.steps} == set(DIFFUSION_MODELS), "catalog: the step engines"


def build_lm_engine(config: EngineConfig, path: Path, name: str) -> Engine:
    """A Hugging Face causal-LM folder as a token-level step engine (offline)."""
    from wattserve.engines.lm_engine import LMEngine

    return LMEngine(
        name,
        model_path=path,
        device=config.device,
        dtype=config.lm_dtype,
        kv_blocks=config.lm_kv_blocks,
        block_size=config.lm_block_size,
        token_budget=config.lm_token_budget,
        max_batch_size=config.max_batch_size,
        chunked_prefill=config.lm_chunked_prefill,
        default_max_tokens=config.lm_default_max_tokens,
        threads=config.torch_threads,
    )


def build_engine(config: EngineConfig) -> Engine:
    """One engine instance for ``config``."""
    model = MODELS.get(config.model)
    if model is not None and model.any_engine:
        return model.build(config)
    engine = ENGINES.get(config.engine)
    if engine is None:
        raise ValueError(f"no engine named {config.engine!r}; engines: {', '.join(ENGINES)}")
    return engine(config)

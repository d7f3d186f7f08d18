"""The engine part of a model's configuration: everything an engine builder reads.

The server builds one ``EngineConfig`` per model (from its settings, or a repository
model's config.pbtxt parameters) and hands each builder only this; an engine instance on
another device gets a copy with ``device`` replaced. Field names are the settings' names
(``WATTSERVE_<NAME>``), so a knob reads the same in every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from wattserve.engines.catalog import EngineName


@dataclass(frozen=True)
class EngineConfig:
    model: str = "mobilenet_v2"  # a built-in model name (engines/catalog.py) or the served model's
    engine: EngineName = "torch"
    device: str = "auto"
    max_batch_size: int = 8  # the largest batch the engine must take
    weights: str | None = None
    seed: int = 0
    fp16: bool = False
    channels_last: bool = True
    fuse_conv_bn: bool = True
    flush_denormal: bool = False  # CPU engines: subnormal floats read and written as zero
    torch_threads: int | None = None
    identity_elements: int = 16
    identity_delay_ms: float = 0.0
    identity_delay_per_item_ms: float = 0.0
    onnx_path: Path | None = None
    cache_dir: Path = Path(".cache/wattserve")
    trt_profiles: str = "1:1:1,2:4:8,8:16:32"
    cuda_graphs: bool = False
    engine_batch_sizes: Sequence[int] | None = None
    diffusion_model: Path | None = None
    diffusion_scheduler: str = "ddim"
    diffusion_default_steps: int = 20
    lm_kv_blocks: int = 512  # lm_*: a Hugging Face causal-LM folder's engine (engines/lm_engine.py)
    lm_block_size: int = 16
    lm_token_budget: int = 512
    lm_chunked_prefill: bool = True
    lm_default_max_tokens: int = 16
    lm_dtype: str = "float32"
    # a Python-backend model (engines/python_backend/): its instances' processes or threads
    python_model_isolation: str = "process"
    python_execute_timeout_s: float | None = None
    python_stub_timeout_s: float = 30.0

    def on(self, device: str) -> EngineConfig:
        """The same engine on another device (one engine instance per device)."""
        return self if device == self.device else replace(self, device=device)

"""The names of the built-in models and of the engines: their one home.

The registry builds engines from these names, the engine modules check them and the server
settings offer them as choices; all import this module, which imports nothing of wattserve,
so no engine module has to import the registry (that made an import cycle through every
engine the registry builds).
"""

from __future__ import annotations

from typing import Literal, get_args

# The image classifiers every engine serves: torch directly, ONNX Runtime and TensorRT
# through their checked ONNX export (engines/onnx_export.py).
TORCHVISION_MODELS = ("resnet50", "mobilenet_v2", "mobilenet_v3_large")
# Step engines (engines/diffusion.py, engines/text_to_image.py): iteration-level batching
# applies to them. stable_diffusion serves the local folder WATTSERVE_DIFFUSION_MODEL names.
DIFFUSION_MODELS = ("tiny_unet", "stable_diffusion")
# Every model wattserve serves without a model file (engines/registry.py builds each).
BUILTIN_MODELS = ("identity", *TORCHVISION_MODELS, *DIFFUSION_MODELS)

EngineName = Literal["torch", "onnxruntime", "tensorrt"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)

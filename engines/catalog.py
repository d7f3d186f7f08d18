"""Names of the built-in models that more than one engine module needs.

The registry builds engines from these names and the engine modules check them; both import
this module, which imports nothing, so no engine module has to import the registry (that
made an import cycle through every engine the registry builds).
"""

from __future__ import annotations

# The image classifiers every engine serves: torch directly, ONNX Runtime and TensorRT
# through their checked ONNX export (engines/onnx_export.py).
TORCHVISION_MODELS = ("resnet50", "mobilenet_v2", "mobilenet_v3_large")

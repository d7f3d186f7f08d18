"""``wattserve export --model resnet50 --repository DIR``: a ready Triton repository entry.

Writes ``DIR/<model>/1/model.onnx`` (the same checked export as ``wattserve export``) and a
``config.pbtxt`` built as a ``ModelConfig`` message and printed by protobuf's text format,
so Triton and wattserve both serve the directory unchanged. No ``instance_group``: each
server puts the model on its default device (Triton: every GPU, else CPU; wattserve:
``WATTSERVE_DEVICE``). The command line is in ``server/engine_commands.py``.
"""

from __future__ import annotations

from pathlib import Path

from wattserve.engines import onnx_export
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository.config import CONFIG_FILE, to_text


def entry_config(model: str, max_batch_size: int, max_queue_delay_us: int) -> pb.ModelConfig:
    """The config of an exported torchvision classifier (input [3,224,224] -> logits [1000])."""
    config = pb.ModelConfig(name=model, platform="onnxruntime_onnx", max_batch_size=max_batch_size)
    config.input.add(name=onnx_export.INPUT_NAME, data_type=pb.TYPE_FP32, dims=list(onnx_export.IMAGE_SHAPE))
    config.output.add(name=onnx_export.OUTPUT_NAME, data_type=pb.TYPE_FP32, dims=[1000])
    config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    return config


def write_entry(repository: Path, model: str, onnx_file: Path, config: pb.ModelConfig) -> Path:
    entry = Path(repository) / model
    (entry / "1").mkdir(parents=True, exist_ok=True)
    target = entry / "1" / "model.onnx"
    if onnx_file.resolve() != target.resolve():
        target.write_bytes(onnx_file.read_bytes())
    (entry / CONFIG_FILE).write_text(to_text(config))
    return entry

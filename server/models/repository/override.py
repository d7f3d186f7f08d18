"""A load request's overrides: a JSON ``config`` and ``file:<path>`` model files (Triton's protocol).

Triton's repository extension lets ``load`` carry ``parameters.config`` (a ModelConfig as
JSON; Model Analyzer loads each candidate configuration this way) and ``file:<path>``
parameters (the model directory's files: base64 strings over HTTP, ``bytes_param`` over
gRPC). The config replaces the repository's config.pbtxt for that load; files, which need a
config beside them, replace the whole model directory: they are written into a private
temporary directory, laid out as the model directory (``file:1/model.onnx`` -> version 1),
removed when the model is unloaded or loaded again with other files.
(qa/L0_lifecycle/lifecycle_test.py: test_config_override, test_file_override,
test_file_override_security.)
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from google.protobuf import json_format
from wattserve.server.models.repository import model_config_pb2 as pb

FILE_PREFIX = "file:"


class OverrideError(ValueError):
    """The override cannot be used as given (400 / INVALID_ARGUMENT); the message says why."""


@dataclass
class LoadOverride:
    config: pb.ModelConfig
    model_dir: Path | None = None  # the files' directory, when the load sent files
    _tmp: Path | None = None

    def close(self) -> None:
        """Remove the temporary model directory (idempotent)."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def parse_override(name: str, config_json: object, files: Mapping[str, bytes]) -> LoadOverride | None:
    """The override a load request carries, or None when it carries none."""
    if config_json is None and not files:
        return None
    if config_json is None:
        # Triton's words for this case, then ours: the config is the reminder that the
        # repository's directory is not used.
        raise OverrideError(
            f"failed to load '{name}', failed to poll from model repository: 'file:' parameters "
            "need a 'config' parameter beside them (the files replace the model directory)"
        )
    if not isinstance(config_json, str):
        raise OverrideError(f"load of '{name}': parameter 'config' must be a string holding JSON")
    config = pb.ModelConfig()
    try:
        json_format.Parse(config_json, config)
    except json_format.ParseError as exc:
        raise OverrideError(
            f"load of '{name}': parameter 'config' is not a JSON ModelConfig: {exc}"
        ) from None
    if config.name and config.name != name:
        raise OverrideError(f"load of '{name}': the override config's name is {config.name!r}")
    override = LoadOverride(config)
    if files:
        override._tmp = Path(tempfile.mkdtemp(prefix="wattserve-override-"))
        override.model_dir = override._tmp / name
        try:
            for key, content in files.items():
                _write(override.model_dir, key, content)
        except OverrideError:
            override.close()
            raise
    return override


def _write(model_dir: Path, key: str, content: bytes) -> None:
    """One ``file:<relative path>`` inside ``model_dir``; a path that would leave it is refused."""
    rel = PurePosixPath(key.removeprefix(FILE_PREFIX))
    if not rel.parts or rel.is_absolute() or any(p in ("", ".", "..") for p in rel.parts):
        raise OverrideError(
            f"failed to load: parameter {key!r}: the path must stay inside the model directory"
        )
    target = model_dir.joinpath(*rel.parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.parent.resolve() != (model_dir.resolve().joinpath(*rel.parts[:-1])):
        raise OverrideError(
            f"failed to load: parameter {key!r}: the path must stay inside the model directory"
        )
    target.write_bytes(content)

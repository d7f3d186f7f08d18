"""NVIDIA's tools (perf_analyzer, Model Analyzer) live in venvs of their own, installed by
scripts/install_perf_analyzer.sh and scripts/install_model_analyzer.sh; an environment
variable names each executable. Locally a missing tool skips its tests; under ``CI=true`` it
fails them, because CI must run them (.ci/run installs both)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def required_tool(variable: str, install: str) -> Path:
    """The executable ``$variable`` names; skip (locally) or fail (CI=true) without it."""
    value = os.environ.get(variable, "")
    path = Path(value) if value else None
    if path is not None and path.is_file() and os.access(path, os.X_OK):
        return path
    message = f"{variable} does not name an executable ({value or 'unset'}); run {install} and export it"
    if os.environ.get("CI") == "true":
        pytest.fail(message + "; CI must run this check")
    pytest.skip(message)

"""Shared set-up of the text-to-image tests: one tiny Stable Diffusion folder per test process.

``scripts/build_tiny_sd.py`` writes it (random weights, offline, a few seconds) into a
temporary folder, removed when the test process ends.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

from scripts.build_tiny_sd import build


@cache
def tiny_sd_path() -> Path:
    """The tiny pipeline, built once per process."""
    folder = Path(tempfile.mkdtemp(prefix="tiny-sd-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return build(folder / "tiny-sd")

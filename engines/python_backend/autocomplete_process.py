"""``auto_complete_config`` of a Python model in a short-lived process (process isolation).

Triton imports ``model.py`` and runs its ``auto_complete_config`` in a stub, never in the
server; with ``python_model_isolation`` process wattserve does the same, so a model whose
import crashes, hangs or drags in heavy modules fails (or costs) only that process:
``python -m wattserve.engines.python_backend.autocomplete_process MODEL_PY`` reads the config
(Triton's JSON) on stdin and writes ``{"config": ...}`` (the completed config, or null when
the model has no ``auto_complete_config``) or ``{"error": ...}`` on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MODULE = "wattserve.engines.python_backend.autocomplete_process"


class AutoCompleteFailed(Exception):
    """What went wrong, worded for the planner's ConfigError (which names the file)."""


def complete_in_process(path: Path, config: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
    """The completed config (None: the model has no ``auto_complete_config``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run([sys.executable, "-m", MODULE, str(path)], input=json.dumps(config), env=env,
                              capture_output=True, text=True, timeout=timeout_s, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AutoCompleteFailed(f"importing the model and running auto_complete_config took longer than "
                                 f"{timeout_s:g} s (python_stub_timeout_s)") from None  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-3:]
        raise AutoCompleteFailed(f"the process importing the model exited with code {done.returncode}"
                                 + (f": {' | '.join(tail)}" if tail else ""))  # fmt: skip
    answer = json.loads(lines[-1])
    if "error" in answer:
        raise AutoCompleteFailed(answer["error"])
    completed: dict[str, Any] | None = answer["config"]
    return completed


def _complete(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    from wattserve.engines.python_backend.autocomplete import ModelConfig
    from wattserve.engines.python_backend.engine import MODEL_CLASS, load_model_module

    try:
        model_class = getattr(load_model_module(path), MODEL_CLASS)
    except Exception as exc:
        return {"error": f"cannot import the model: {type(exc).__name__}: {exc}"}
    complete = getattr(model_class, "auto_complete_config", None)
    if complete is None:
        return {"config": None}
    try:
        completed = complete(ModelConfig(config))
        data = completed.as_dict() if completed is not None else None
    except Exception as exc:
        return {"error": f"auto_complete_config raised {type(exc).__name__}: {exc}"}
    if data is None:
        return {"error": "auto_complete_config returned None (it must return the config)"}
    return {"config": data}


def main(argv: list[str]) -> None:
    answer = _complete(Path(argv[1]), json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(answer) + "\n")  # last line: a model may print too


if __name__ == "__main__":
    main(sys.argv)

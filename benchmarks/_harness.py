"""Shared by the benchmarks: servers through the project's one harness, wrk, result files."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from wattserve.loadgen.server_process import ServerProcess, free_port, running_wattserve

__all__ = ["RESULTS", "ROOT", "free_port", "process", "save", "wattserve", "wrk"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


@contextlib.contextmanager
def process(
    cmd: list[str], env: dict[str, str], ready_url: str, timeout: float = 300, root: Path = ROOT
) -> Iterator[ServerProcess]:
    """Any server program (a bare app, Triton) through the project's harness, ready for the
    block; ``ready_url`` is polled until 200 (or 405: a POST-only route answers a GET that
    way once it is up). ``root``: the checkout whose code it runs."""
    parts = urlsplit(ready_url)
    full_env = {**os.environ, **env, "PYTHONPATH": str(root)}
    proc = ServerProcess(cmd, full_env, parts.port or 80, cwd=root, ready_path=parts.path,
                         ready_statuses=(200, 405), ready_timeout_s=timeout)  # fmt: skip
    with proc:
        yield proc


@contextlib.contextmanager
def wattserve_process(env: dict[str, str], root: Path = ROOT) -> Iterator[ServerProcess]:
    """``python -m wattserve serve`` from ``root`` (another checkout gives a before/after
    comparison in the same run); yields the process (its ``url`` and ``pid``)."""
    with running_wattserve({"WATTSERVE_LOG_LEVEL": "warning", **env}, root=root) as proc:
        yield proc


@contextlib.contextmanager
def wattserve(env: dict[str, str], root: Path = ROOT) -> Iterator[str]:
    """``wattserve_process``, yielding only its base url."""
    with wattserve_process(env, root=root) as proc:
        yield proc.url


def wrk(
    url: str, body: bytes, connections: int, seconds: float, headers: dict[str, str] | None = None
) -> dict:
    """Closed-loop load with wrk (C, one thread) so the client costs little CPU."""
    if shutil.which("wrk") is None:
        raise SystemExit("this benchmark needs wrk (Debian: apt-get install wrk)")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "body.bin").write_bytes(body)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        lua_headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in hdrs.items())
        script = Path(tmp) / "post.lua"
        script.write_text(
            f'wrk.method = "POST"\nlocal f = io.open("{tmp}/body.bin", "rb")\n'
            f"wrk.body = f:read('*all')\nf:close()\n{lua_headers}\n"
        )
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", "--timeout", "60s", f"-d{max(1, round(seconds))}s", "--latency",
             "-s", str(script), url],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    return {"rps": rps, "non_2xx": int(non2xx.group(1)) if non2xx else 0,
            "p50_ms": _ms(p50), "p99_ms": _ms(p99)}  # fmt: skip


def _ms(match: re.Match | None) -> float | None:
    if match is None:
        return None
    value, unit = float(match.group(1)), match.group(2)
    return value * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """A benchmark's ``--variant NAME:VAR=VALUE[,VAR=VALUE]`` -> (NAME, {VAR: VALUE}): the
    same server with these environment variables, measured in the same run."""
    name, _, assignments = text.partition(":")
    if not name or not assignments:
        raise argparse.ArgumentTypeError(f"expected NAME:VAR=VALUE[,VAR=VALUE], got {text!r}")
    return name, dict(kv.split("=", 1) for kv in assignments.split(","))


def save(name: str, doc: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2))
    return path

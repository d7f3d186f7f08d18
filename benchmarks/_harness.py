"""Shared by the benchmarks: start a server process, wait for it, drive it with wrk."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process(
    cmd: list[str], env: dict[str, str], ready_url: str, timeout: float = 300, root: Path = ROOT
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` until the block ends (the block gets its Popen); its output goes to a log file (a pipe nobody reads
    would fill up and stall the server), shown if it dies. ``root``: the checkout whose code
    it runs (another one gives a before/after comparison in the same run)."""
    full_env = {**os.environ, **env, "PYTHONPATH": str(root)}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, env=full_env, cwd=root, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"{cmd} exited: {log.read().decode(errors='replace')[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(ready_url, timeout=1).status_code in (200, 405):
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{cmd} not ready after {timeout}s")
                time.sleep(0.2)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def wattserve(env: dict[str, str], root: Path = ROOT) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"WATTSERVE_LOG_LEVEL": "warning", "WATTSERVE_GRPC_PORT": "0", **env, "WATTSERVE_PORT": str(port)}
    with process([sys.executable, "-m", "wattserve", "serve"], env, url + "/v2/health/ready", root=root):
        yield url


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


def save(name: str, doc: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2))
    return path

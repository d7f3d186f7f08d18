"""Which models of a Triton-layout repository wattserve loads, and why the rest do not.

A Triton user's first question about a new server is "does it load my repository?". This
starts ``python -m wattserve serve --model-repository DIR`` (from ``--root``, a checkout, or
the installed wattserve), waits until the HTTP port answers, asks ``POST /v2/repository/index``
and prints, per model version, READY or the reason wattserve gives; failures are grouped by
reason (numbers, quoted names and paths folded so that "same cause" groups together). The
JSON lands under ``results/`` unless ``--out`` says otherwise.

    python benchmarks/repository_load_report.py /path/to/model_repository
    python benchmarks/repository_load_report.py REPO --root ../main --port 8000 --grpc-port 0

It uses only the standard library so it runs against any checkout, old or new.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path


def _post(url: str, body: dict, timeout: float = 30.0) -> tuple[int, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, text


def _wait_live(base: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    """True once /v2/health/live answers 200; False if the server exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(base + "/v2/health/live", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


def reason_key(reason: str) -> str:
    """The reason with model names, quoted text, paths and numbers folded, for grouping."""
    key = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", reason)
    key = re.sub(r"(/[\w.\-]+)+", "/…", key)
    key = re.sub(r"\([^)]*\)", "(…)", key)
    key = re.sub(r"\[[^\]]*\]", "[…]", key)
    key = re.sub(r"\b\d+\b", "N", key)
    return key.strip()[:240]


def summarize(index: list[dict]) -> dict:
    """Counts per model (a model loads if any version is READY) and failures grouped by reason."""
    by_model: dict[str, list[dict]] = defaultdict(list)
    for entry in index:
        by_model[entry.get("name", "?")].append(entry)
    loaded = sorted(m for m, es in by_model.items() if any(e.get("state") == "READY" for e in es))
    groups: dict[str, list[str]] = defaultdict(list)
    examples: dict[str, str] = {}
    for model, entries in sorted(by_model.items()):
        if model in loaded:
            continue
        reason = next((e.get("reason") for e in entries if e.get("reason")), "") or "(no reason given)"
        key = reason_key(reason)
        groups[key].append(model)
        examples.setdefault(key, reason)
    failures = [
        {"reason": key, "count": len(models), "example_reason": examples[key], "models": models}
        for key, models in sorted(groups.items(), key=lambda kv: -len(kv[1]))
    ]
    return {"models": len(by_model), "loaded": len(loaded), "loaded_models": loaded, "failures": failures}


def run(args: argparse.Namespace) -> dict:
    repo = Path(args.repository).resolve()
    env = dict(os.environ)
    if args.root:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(Path(args.root).resolve()), env.get("PYTHONPATH")])
        )
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [args.python, "-m", "wattserve", "serve", "--model-repository", str(repo), "--port", str(args.port)]
    cmd += ["--grpc-port", str(args.grpc_port), *args.extra]
    with tempfile.NamedTemporaryFile(prefix="load_report_", suffix=".log", delete=not args.keep_log) as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return _report(args, repo, cmd, proc, Path(log.name))
        finally:
            _stop(proc)
            if args.keep_log:
                print(f"server log: {log.name}", file=sys.stderr)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL it if it has not gone in 20 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _report(args: argparse.Namespace, repo: Path, cmd: list[str], proc: subprocess.Popen, log: Path) -> dict:
    start = time.monotonic()
    base = f"http://127.0.0.1:{args.port}"
    if not _wait_live(base, proc, args.timeout_s):
        return {
            "repository": str(repo),
            "error": "server did not come up",
            "log_tail": log.read_text(errors="replace")[-4000:],
        }
    startup_s = time.monotonic() - start
    status, index = _post(base + "/v2/repository/index", {})
    if status != 200 or not isinstance(index, list):
        return {"repository": str(repo), "error": f"index answered {status}: {index}"}
    report = {"repository": str(repo), "command": cmd, "startup_s": round(startup_s, 1)}
    report.update(summarize(index))
    report["index"] = index
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repository", help="Triton-layout model repository")
    parser.add_argument("--root", help="wattserve checkout to run (PYTHONPATH); default: the installed one")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the server")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="longest wait for start-up")
    parser.add_argument("--out", help="JSON path; default results/repository_load_<repo>.json")
    parser.add_argument("--keep-log", action="store_true", help="keep the server log and print its path")
    parser.add_argument("extra", nargs="*", help="more `wattserve serve` flags (after --)")
    args = parser.parse_args(argv)
    report = run(args)
    out = Path(args.out or f"results/repository_load_{Path(args.repository).resolve().name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    if "error" in report:
        print(f"{report['repository']}: {report['error']}\n{report.get('log_tail', '')}")
        return 2
    print(f"{Path(report['repository']).name}: loaded {report['loaded']} of {report['models']} models")
    for group in report["failures"]:
        names = ", ".join(group["models"][:3]) + (", …" if group["count"] > 3 else "")
        example = group["example_reason"].replace(report["repository"] + "/", "")
        print(f"  {group['count']:4d}  {example[:200]}\n        e.g. {names}")
    print(f"(JSON: {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

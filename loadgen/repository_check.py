"""``wattserve repository check DIR``: which models of a Triton-layout repository wattserve
loads, and why the rest do not.

A Triton user's first question about a new server is "does it load my repository?". This
starts ``wattserve serve --model-repository DIR`` the way a user would (through the one
server harness, ``loadgen/server_process.py``; ``--root`` runs another checkout), waits until
it is live, asks ``POST /v2/repository/index`` and prints, per model, READY or the reason
wattserve gives. Failures are grouped by reason, with names, quoted text, paths and numbers
folded so that "same cause" groups together. Exit status: 0 when every model loads, 1 when
some do not, 2 when the server does not come up (so a repository can be checked in CI). It
asks the server rather than planning the models itself so that the answer is exactly what
serving would do.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from .server_process import ServerProcess, free_port, serve_command, server_env

LIVE_PATH = "/v2/health/live"  # not ready: a repository with one broken model is never ready


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


def _repository_index(url: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + "/v2/repository/index", data=b"{}", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def check(
    repository: Path, *, root: Path | None = None, extra: list[str] | None = None, timeout_s: float = 600.0
) -> dict:
    """Serve ``repository`` on a free loopback port, read its index, stop the server."""
    repository = repository.resolve()
    port = free_port()
    command = [*serve_command(root), "--model-repository", str(repository), "--port", str(port)]
    command += ["--grpc-port", "0", *(extra or [])]
    env = server_env()
    if root is not None:
        env["PYTHONPATH"] = str(root.resolve())
    server = ServerProcess(command, env, port, cwd=root, ready_path=LIVE_PATH, ready_timeout_s=timeout_s)
    server.start()
    try:
        try:
            startup_s = server.wait_ready()
        except RuntimeError as exc:
            return {"repository": str(repository), "error": f"server did not come up: {exc}"}
        status, index = _repository_index(server.url)
        if status != 200 or not isinstance(index, list):
            return {"repository": str(repository), "error": f"index answered {status}: {index}"}
        report: dict[str, Any] = {"repository": str(repository), "command": command}
        report["startup_s"] = round(startup_s, 1)
        report.update(summarize(index))
        report["index"] = index
        return report
    finally:
        server.stop()


def render(report: dict) -> str:
    """The report for a terminal: the count, then one block per reason."""
    if "error" in report:
        return f"{report['repository']}: {report['error']}"
    lines = [f"{Path(report['repository']).name}: loaded {report['loaded']} of {report['models']} models"]
    for group in report["failures"]:
        names = ", ".join(group["models"][:3]) + (", …" if group["count"] > 3 else "")
        example = group["example_reason"].replace(report["repository"] + "/", "")
        lines.append(f"  {group['count']:4d}  {example[:200]}\n        e.g. {names}")
    return "\n".join(lines)


def add_repository_parser(subparsers: Any) -> argparse.ArgumentParser:
    repository = subparsers.add_parser("repository", help="check a Triton-layout model repository")
    sub = repository.add_subparsers(dest="repository_command", required=True)
    p = sub.add_parser(
        "check",
        help="serve a repository once and report which models load, and why the rest do not",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("repository", type=Path, help="Triton-layout model repository")
    p.add_argument("--root", type=Path, help="wattserve checkout to run; default: this one")
    p.add_argument("--timeout-s", type=float, default=600.0, help="longest wait for start-up")
    p.add_argument("--json", type=Path, help="also write the whole report (the index included) here")
    p.add_argument("extra", nargs="*", help="more `wattserve serve` flags (after --)")
    p.set_defaults(func=cmd_repository_check)
    return p


def cmd_repository_check(args: argparse.Namespace) -> int:
    report = check(args.repository, root=args.root, extra=args.extra, timeout_s=args.timeout_s)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    if "error" in report:
        print(render(report), file=sys.stderr)
        return 2
    print(render(report))
    return 0 if report["loaded"] == report["models"] else 1

"""Replay a Dockerfile's COPY lines from a build context into an empty folder, as a build would.

An image build sees only what its COPY lines bring in; the editable install and the tests see
the whole checkout. Replaying the COPY set (stage by stage, WORKDIR-relative, --from and
--chown understood, .dockerignore applied) and building the wheel where the Dockerfile runs
``pip install .`` shows whether the image can build, without a container engine.
dockerfile-parse reads the instructions (continuations, comments, JSON form); the copy
semantics here are Docker's: a directory source copies its contents, a file into a ``/``-ended
or multi-source destination keeps its name.
"""

from __future__ import annotations

import fnmatch
import io
import json
import posixpath
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser

# `pip install .`, `pip install '.[onnx]'`, `pip install --flag ... .[x] other`.
_PIP_INSTALL_DOT = re.compile(r"""pip\s+install\b[^&;|]*?\s['"]?\.(?:\[[^\]]*\])?['"]?(?=\s|$)""")


@dataclass
class Stage:
    """One FROM ... stage: its replayed filesystem root and where it builds the project."""

    index: int
    name: str | None
    root: Path
    workdir: str = "/"
    builds: list[Path] = field(default_factory=list)  # snapshots of the workdir at `pip install .`
    skipped: list[str] = field(default_factory=list)  # COPY --from an image or of RUN output


def _args(value: str) -> list[str]:
    """COPY's arguments, exec (JSON) or shell form."""
    value = value.strip()
    if value.startswith("["):
        return [str(a) for a in json.loads(value)]
    return shlex.split(value)


def _matches(relative: str, pattern: str) -> bool:
    """One .dockerignore pattern against a path or any folder above it. fnmatch's ``*`` crosses
    ``/`` (Go's does not), so this excludes at least what Docker does: the conservative side."""
    parts = relative.split("/")
    if pattern.startswith("**/"):
        rest = pattern[3:]
        spans = ("/".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1))
        return any(fnmatch.fnmatchcase(span, rest) for span in spans)
    return any(fnmatch.fnmatchcase("/".join(parts[: i + 1]), pattern) for i in range(len(parts)))


def _ignored(relative: str, patterns: list[str]) -> bool:
    """.dockerignore: the last pattern that matches decides; ``!pattern`` re-includes."""
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        if _matches(relative, pattern.removeprefix("!").strip("/")):
            excluded = not negate
    return excluded


def _dockerignore(context: Path) -> list[str]:
    path = context / ".dockerignore"
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _copy_tree(source: Path, dest: Path, base: Path, patterns: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for item in sorted(source.iterdir()):
        relative = item.relative_to(base).as_posix()
        if patterns and _ignored(relative, patterns):
            continue
        if item.is_dir():
            _copy_tree(item, dest / item.name, base, patterns)
        else:
            shutil.copy2(item, dest / item.name)


def _resolve(stage: Stage, path: str) -> Path:
    absolute = posixpath.normpath(posixpath.join(stage.workdir, path))
    return stage.root / absolute.lstrip("/")


def _copy(stage: Stage, args: list[str], src_root: Path, base: Path, patterns: list[str]) -> None:
    *sources, dest = args
    if not sources:
        raise ValueError(f"COPY without a source: {args}")
    matches: list[Path] = []
    for source in sources:
        if "$" in source:
            raise ValueError(f"COPY source {source!r}: variables are not replayed")
        found = sorted(src_root.glob(source.lstrip("/"))) if any(c in source for c in "*?[") else []
        if not found:
            single = src_root / source.lstrip("/")
            if not single.exists():
                raise FileNotFoundError(f"COPY {source}: not in the build context")
            found = [single]
        matches.extend(found)
    into_dir = dest.endswith("/") or len(matches) > 1 or any(c in "".join(sources) for c in "*?[")
    target = _resolve(stage, dest)
    for match in matches:
        if match.is_dir():
            _copy_tree(match, target, base, patterns)
            continue
        if patterns and src_root == base and _ignored(match.relative_to(base).as_posix(), patterns):
            continue
        out = target / match.name if into_dir or target.is_dir() else target
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(match, out)


def replay(dockerfile: Path, context: Path, into: Path) -> list[Stage]:
    """Every stage of ``dockerfile`` with its context COPYs replayed under ``into``."""
    parser = DockerfileParser(fileobj=io.BytesIO(dockerfile.read_bytes()))
    patterns = _dockerignore(context)
    stages: list[Stage] = []
    for instruction in parser.structure:
        kind, value = instruction["instruction"], instruction["value"]
        if kind == "FROM":
            words = value.split()
            name = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else None
            stages.append(Stage(len(stages), name, into / f"stage{len(stages)}"))
            stages[-1].root.mkdir(parents=True)
            continue
        if not stages:
            continue  # ARG before the first FROM
        stage = stages[-1]
        if kind == "WORKDIR":
            stage.workdir = posixpath.normpath(posixpath.join(stage.workdir, value.strip()))
            _resolve(stage, ".").mkdir(parents=True, exist_ok=True)
        elif kind in ("COPY", "ADD"):
            args = _args(value)
            flags = {a.split("=", 1)[0]: a.partition("=")[2] for a in args if a.startswith("--")}
            args = [a for a in args if not a.startswith("--")]
            if "--from" in flags:
                origin = next((s for s in stages[:-1] if flags["--from"] in (s.name, str(s.index))), None)
                present = origin is not None and all(
                    (origin.root / a.lstrip("/")).exists() for a in args[:-1]
                )
                if origin is None or not present:
                    stage.skipped.append(value)  # another image, or what a RUN made
                    continue
                _copy(stage, args, origin.root, origin.root, [])
            else:
                _copy(stage, args, context, context, patterns)
        elif kind == "RUN" and _PIP_INSTALL_DOT.search(value):
            snapshot = into / f"stage{stage.index}-build{len(stage.builds)}"
            shutil.copytree(_resolve(stage, "."), snapshot)
            stage.builds.append(snapshot)
    return stages

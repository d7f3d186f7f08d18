"""The images keep building: each Dockerfile's COPY set, replayed into an empty folder, builds a
wheel holding every package pyproject.toml installs. A new top-level package folder that the
Dockerfiles do not COPY fails here instead of in an image build (which CI does not run: it
takes tens of minutes, docs/deployment.md). The images themselves: scripts/build_image.sh and
scripts/check_image.sh."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from wattserve.server.settings import Settings

from tests.dockerfile_replay import replay

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = ("Dockerfile", "Dockerfile.cpu")


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_replay_follows_stages_workdir_flags_and_dockerignore(tmp_path: Path) -> None:
    context = tmp_path / "context"
    _write(context, {
        "pyproject.toml": "", "README.md": "", "notes.txt": "n",
        "pkg/__init__.py": "", "pkg/sub/mod.py": "", "pkg/__pycache__/mod.cpython-311.pyc": "",
        "other/x.py": "",
        ".dockerignore": "# comment\n**/__pycache__\n",
        "Dockerfile": "\n".join([
            "ARG BASE=python:3.11-slim",
            "FROM ${BASE} AS build",
            "WORKDIR /src",
            "COPY --chown=1000:1000 pyproject.toml README.md ./",
            'COPY ["pkg", "./pkg"]',
            "COPY notes.txt renamed.txt",
            "RUN pip install --upgrade pip \\",
            "    && pip install '.[extra]'",
            "COPY other ./other",
            "FROM ${BASE}",
            "WORKDIR app",
            "COPY --from=build /src/pkg ./pkg",
            "COPY --from=build /opt/venv /opt/venv",
            "COPY --from=docker.io/library/alpine /bin/sh /bin/sh",
        ]),
    })  # fmt: skip
    build, runtime = replay(context / "Dockerfile", context, tmp_path / "out")
    assert build.name == "build" and runtime.name is None
    (snapshot,) = build.builds
    got = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    # what the RUN saw: not `other/` (copied after it), not the ignored __pycache__
    assert got == ["README.md", "pkg/__init__.py", "pkg/sub/mod.py", "pyproject.toml", "renamed.txt"]
    assert (build.root / "src/other/x.py").exists()
    assert (runtime.root / "app/pkg/sub/mod.py").exists()
    assert runtime.builds == []
    assert runtime.skipped == [
        "--from=build /opt/venv /opt/venv",
        "--from=docker.io/library/alpine /bin/sh /bin/sh",
    ]


def test_replay_refuses_a_source_the_context_lacks(tmp_path: Path) -> None:
    _write(tmp_path, {"Dockerfile": "FROM scratch\nCOPY missing ./missing\n"})
    with pytest.raises(FileNotFoundError, match="missing"):
        replay(tmp_path / "Dockerfile", tmp_path, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_copy_set_builds_a_wheel_with_every_package(dockerfile: str, tmp_path: Path) -> None:
    """Offline, as tests/test_packaging.py builds: no build isolation, no dependencies."""
    stages = replay(ROOT / dockerfile, ROOT, tmp_path / "replay")
    builds = [build for stage in stages for build in stage.builds]
    assert builds, f"{dockerfile}: no stage runs `pip install .`"
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for n, source in enumerate(builds):
        out = tmp_path / f"wheel{n}"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
             str(out), str(source)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{dockerfile}: the wheel does not build from its COPY set:\n{done.stderr[-3000:]}"
        )
        (wheel,) = out.glob("wattserve-*.whl")
        names = set(zipfile.ZipFile(wheel).namelist())
        missing = [p for p in packages if f"{p.replace('.', '/')}/__init__.py" not in names]
        assert not missing, f"{dockerfile}: the wheel lacks {missing}"


def _runtime_stage(dockerfile: str) -> dict[str, list[str]]:
    """The last stage's instructions, by kind: what the image that runs is made of."""
    parser = DockerfileParser(fileobj=io.BytesIO((ROOT / dockerfile).read_bytes()))
    stage: dict[str, list[str]] = {}
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            stage = {}
        stage.setdefault(instruction["instruction"], []).append(instruction["value"])
    return stage


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_runtime_stage_is_unprivileged_checked_and_drains(dockerfile: str) -> None:
    stage = _runtime_stage(dockerfile)
    user = stage["USER"][-1].split(":")[0]
    assert user not in ("root", "0"), f"{dockerfile} runs as root"
    (health,) = stage["HEALTHCHECK"]
    assert "/v2/health/ready" in health and '"python"' in health  # the image has python, not curl
    exposed = {int(p.split("/")[0]) for line in stage["EXPOSE"] for p in line.split()}
    defaults = Settings()
    assert {defaults.port, defaults.grpc_port} <= exposed
    env = " ".join(stage["ENV"])
    assert f"WATTSERVE_PORT={defaults.port}" in env and f"WATTSERVE_GRPC_PORT={defaults.grpc_port}" in env
    # exec form: the server is PID 1 and receives the stop signal itself (no sh -c in between)
    assert stage["CMD"][-1].startswith("["), stage["CMD"]
    assert stage["STOPSIGNAL"] == ["SIGTERM"]
    assert "build-essential" not in " ".join(stage.get("RUN", [])), "the compiler belongs in the build stage"


def _default(value: str) -> str:
    """Compose's ``${VAR:-default}`` as compose would read it with VAR unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_compose_service_matches_the_image_and_the_settings() -> None:
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.yml").read_text())
    service = compose["services"]["wattserve"]
    assert (
        ROOT / "deploy" / service["build"]["context"] / _default(service["build"]["dockerfile"])
    ).is_file()
    env = service["environment"]
    published = {int(p.split(":")[-1]) for p in service["ports"]}
    assert {int(env["WATTSERVE_PORT"]), int(env["WATTSERVE_GRPC_PORT"])} <= published
    grace = int(service["stop_grace_period"].removesuffix("s"))
    assert grace > Settings().drain_timeout_s, "compose would SIGKILL before the drain times out"
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    target = scrape["scrape_configs"][0]["static_configs"][0]["targets"][0]
    assert target == f"wattserve:{env['WATTSERVE_PORT']}"

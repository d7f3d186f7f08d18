"""wattserve installs as one import namespace: nothing named ``server``, ``engines``, ... lands
in a user's site-packages, and every source folder that is a package ships."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_FOLDERS = ("server", "batchers", "engines", "telemetry", "loadgen")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _copy_checkout(target: Path, *extra: str) -> Path:
    """The files a build or a PYTHONPATH run needs, copied out of this checkout."""
    target.mkdir()
    for name in ("pyproject.toml", "wattserve", *SOURCE_FOLDERS, *extra):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target / name)
    return target


def test_every_source_package_is_listed_under_the_namespace() -> None:
    """A new subfolder with an ``__init__.py`` must be added to pyproject's list, or a wheel
    install would lack it while the editable install (which maps folders) still works."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {"wattserve"}
    for folder in SOURCE_FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(ROOT).parts
            on_disk.add(".".join(("wattserve", *relative)))
    assert listed == on_disk


def test_console_script_points_into_the_namespace() -> None:
    assert _pyproject()["project"]["scripts"]["wattserve"] == "wattserve.server.cli:main"


@pytest.mark.slow
def test_wheel_holds_only_the_wattserve_package(tmp_path: Path) -> None:
    """What ``pip install .`` would put into site-packages: one top-level package and its
    dist-info, with the server, its routes and the repository parser inside."""
    source = _copy_checkout(tmp_path / "source", "README.md")  # setuptools writes build/ beside it
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(tmp_path), str(source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("wattserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/", 1)[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"wattserve"}
    for module in ("server/cli.py", "server/http/routes/__init__.py", "server/models/repository/config.py",
                   "batchers/base.py", "engines/torch_engine.py", "telemetry/__init__.py",
                   "loadgen/cli.py", "__main__.py"):  # fmt: skip
        assert f"wattserve/{module}" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "wattserve = wattserve.server.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_a_source_checkout_runs_with_only_pythonpath(tmp_path: Path) -> None:
    """``python -m wattserve`` from a checkout that is not the installed one (how benchmarks
    compare two versions in one run) imports that checkout's files, not the installed ones."""
    other = _copy_checkout(tmp_path / "other-checkout")
    out = subprocess.run(
        [sys.executable, "-c", "import wattserve.server.settings as s; print(s.__file__)"],
        env={"PYTHONPATH": str(other), "PATH": "/usr/bin:/bin"}, cwd=tmp_path,
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert Path(out).resolve() == (other / "server" / "settings.py").resolve()

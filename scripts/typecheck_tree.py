"""Let mypy see the source folders under their import names, and report their real paths.

The folders at the repository root install as ``wattserve.<folder>`` (pyproject's
``[tool.setuptools.package-dir]``), which no static tool follows: an editable install resolves
them through an import hook, not the file system. ``build()`` writes
``.cache/typecheck/pkg/wattserve/<subpackage>`` as symbolic links to the real folders, from the
same package-dir table, and pyproject's ``[tool.mypy]`` puts that tree on ``mypy_path``: mypy
imports ``wattserve.engines.base`` from ``engines/base.py``, once, under its one name.

    python scripts/typecheck_tree.py               build the tree, print its root
    python scripts/typecheck_tree.py mypy [ARGS]   build it, run mypy, paths as in the checkout
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".cache" / "typecheck" / "pkg"


def package_dirs(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Path]:
    """Import name -> source folder, as setuptools maps them."""
    table = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in table.items()}


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and link.resolve() == target.resolve():
        return  # already right: leave it (another check may be reading the tree)
    if link.is_symlink() or link.is_file():
        link.unlink()
    link.symlink_to(target, target_is_directory=target.is_dir())


def build(tree: Path = TREE) -> Path:
    """Create or refresh the link tree; return its root, the directory on mypy's path."""
    for name, folder in sorted(package_dirs().items()):
        parts = name.split(".")
        if len(parts) == 1:  # the top package: a real folder of links to its own modules
            top = tree / name
            top.mkdir(parents=True, exist_ok=True)
            for source in folder.glob("*.py"):
                _link(top / source.name, source)
        else:
            _link(tree.joinpath(*parts), folder)
    return tree


def real_paths(line: str, tree: Path = TREE) -> str:
    """``line`` with every path through the tree replaced by the checkout's own path."""
    prefixes = {f"{'/'.join(name.split('.'))}/": folder for name, folder in package_dirs().items()}
    for inside, folder in sorted(prefixes.items(), key=lambda kv: -len(kv[0])):  # subpackages first
        for base in (f"{tree}/", f"{tree.relative_to(ROOT)}/"):
            line = line.replace(base + inside, f"{folder.relative_to(ROOT)}/")
    return line


def run_mypy(args: list[str]) -> int:
    build()
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
        out.writelines(real_paths(line) for line in stream.splitlines(keepends=True))
    return proc.returncode


if __name__ == "__main__":
    if sys.argv[1:2] == ["mypy"]:
        sys.exit(run_mypy(sys.argv[2:]))
    print(build().relative_to(ROOT))

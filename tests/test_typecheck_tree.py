"""The link tree that shows mypy the source folders under their import names
(scripts/typecheck_tree.py), and the checked list in pyproject's [tool.mypy]."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "typecheck_tree.py"
# Subpackages not yet in the checked list, each with the reason; the lead empties this.
NOT_YET_CHECKED: dict[str, str] = {}


def load_tree():
    spec = importlib.util.spec_from_file_location("typecheck_tree", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tree_links_every_folder_under_its_import_name(tmp_path):
    tree = load_tree()
    root = tree.build(tmp_path / "pkg")
    dirs = tree.package_dirs()
    assert {"wattserve", "wattserve.engines", "wattserve.server"} <= set(dirs)
    for name, folder in dirs.items():
        linked = root.joinpath(*name.split("."))
        assert linked.is_dir() and (linked / "__init__.py").is_file(), name
        assert (linked / "__init__.py").resolve() == (folder / "__init__.py").resolve(), name
    # built again over itself: the same tree, no error
    assert (tree.build(root) / "wattserve" / "engines" / "base.py").resolve() == ROOT / "engines" / "base.py"


def test_messages_name_the_checkouts_files():
    tree = load_tree()
    relative = ".cache/typecheck/pkg/wattserve/engines/base.py:3: error: x  [misc]\n"
    assert tree.real_paths(relative) == "engines/base.py:3: error: x  [misc]\n"
    absolute = f'note: also at "{tree.TREE}/wattserve/batchers/queue.py"'
    assert tree.real_paths(absolute) == 'note: also at "batchers/queue.py"'
    top = ".cache/typecheck/pkg/wattserve/__main__.py:1: error: y"
    assert tree.real_paths(top) == "wattserve/__main__.py:1: error: y"


def test_mypy_checks_every_subpackage_but_the_pending_ones():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mypy = pyproject["tool"]["mypy"]
    subpackages = {n for n in pyproject["tool"]["setuptools"]["package-dir"] if "." in n}
    assert set(mypy["packages"]) == subpackages - set(NOT_YET_CHECKED)
    assert set(mypy["modules"]) == {"wattserve", "wattserve.__main__"}
    assert {p.stem for p in (ROOT / "wattserve").glob("*.py")} == {"__init__", "__main__"}

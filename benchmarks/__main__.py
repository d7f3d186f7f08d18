"""The benchmark suite's one door: ``python -m benchmarks`` lists them, ``python -m
benchmarks NAME [ARGS...]`` runs one (the same as ``python -m benchmarks.NAME ARGS...``).

A benchmark is a module of this folder with a ``main`` and an ``if __name__ == "__main__"``
block; its docstring's first line is what the list says. Modules whose name starts with an
underscore are shared code, not benchmarks. The list is read from the sources (nothing is
imported to list them), so a new benchmark is listed the moment its file exists.
"""

from __future__ import annotations

import ast
import re
import runpy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    name: str
    summary: str


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` at module level."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    sides = [test.left, *test.comparators]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def _defines_main(tree: ast.Module) -> bool:
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main"
        for node in tree.body
    )


def summary(docstring: str) -> str:
    """The docstring's first sentence (its first paragraph, rewrapped, up to a full stop)."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    match = re.match(r"(.+?[.?!])(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def discover(folder: Path = HERE) -> list[Benchmark]:
    """Every runnable benchmark module in ``folder``, by name."""
    found = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        if not (_defines_main(tree) and any(_is_main_guard(node) for node in tree.body)):
            continue
        found.append(Benchmark(path.stem, summary(ast.get_docstring(tree) or "")))
    return found


def listing(benchmarks: Sequence[Benchmark]) -> str:
    width = max((len(b.name) for b in benchmarks), default=0)
    lines = [f"  {b.name:<{width}}  {b.summary}" for b in benchmarks]
    return "\n".join(
        ["usage: python -m benchmarks NAME [ARGS...]   (NAME --help for its options)", "", *lines]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    benchmarks = discover()
    if not args or args[0] in ("-h", "--help", "list"):
        print(listing(benchmarks))
        return 0
    name, rest = args[0].removeprefix("benchmarks."), args[1:]
    if name not in {b.name for b in benchmarks}:
        print(f"benchmarks: no benchmark named {name!r}\n\n{listing(benchmarks)}", file=sys.stderr)
        return 2
    sys.argv = [f"benchmarks.{name}", *rest]
    runpy.run_module(f"benchmarks.{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The docs name only files that exist, and the README stays a guide.

docs/architecture.md is the module map a newcomer reads first; a file renamed or removed
without updating it makes the map lie, so every file path it names must resolve (issue 23).
A module table under a ``### server/`` heading names files relative to that folder.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Names of files in a user's model repository, and the folder benchmarks write: not in this one.
NOT_IN_THE_REPOSITORY = {"config.pbtxt", "model.onnx", "model.pt", "model.plan", "results/"}
FILE = re.compile(r"(?<![\w/.<-])((?:[\w.-]+/)*[\w.{},-]*[\w}]\.(?:py|md|sh|toml|ini|pbtxt|json|ya?ml))\b")
FOLDER = re.compile(r"`((?:[\w.-]+/)+)`")
SECTION = re.compile(r"^#+\s+`?([\w/]+/)`?\s*$")


def _expand(name: str) -> list[str]:
    """``batchers/{static,dynamic}.py`` -> both files."""
    braces = re.search(r"\{([^}]*)\}", name)
    if braces is None:
        return [name]
    return [name[: braces.start()] + part + name[braces.end() :] for part in braces.group(1).split(",")]


def _named_paths(text: str) -> list[tuple[str, str | None, int]]:
    """(path as written, the folder of the section it is in, line number)."""
    found = []
    section: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        heading = SECTION.match(line)
        if heading:
            section = heading.group(1)
        elif line.startswith("#"):
            section = None
        for match in FILE.finditer(line):
            found += [(name, section, number) for name in _expand(match.group(1))]
        for match in FOLDER.finditer(line):
            found.append((match.group(1), section, number))
    return found


def _exists(name: str, section: str | None) -> bool:
    bases = [ROOT, ROOT / "docs"] + ([ROOT / section] if section else [])
    return any((base / name).exists() for base in bases)


def test_architecture_names_only_files_that_exist() -> None:
    named = _named_paths(ARCHITECTURE.read_text())
    assert len(named) > 100, "the path pattern no longer finds the module map's files"
    missing = [
        f"line {number}: {name}" + (f" (under {section})" if section else "")
        for name, section, number in named
        if name not in NOT_IN_THE_REPOSITORY and not _exists(name, section)
    ]
    assert not missing, "docs/architecture.md names files that do not exist:\n" + "\n".join(missing)


def test_the_path_check_catches_a_missing_file() -> None:
    text = "### server/models/\n\n| `model_set.py` | x |\n| `no_such_module.py` | y |\n\nsee `batchers/{queue,nothing}.py`\n"
    missing = [name for name, section, _ in _named_paths(text) if not _exists(name, section)]
    assert missing == ["no_such_module.py", "batchers/nothing.py"]


def test_readme_is_a_short_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 350, (
        "README.md is a user's guide: measurements go to docs/benchmarks.md"
    )
    for command in (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && wattserve serve",
        ". .venv/bin/activate && pip install -e '.[dev]' && python -m pytest",
    ):
        assert command in readme
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's tests

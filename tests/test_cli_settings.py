"""``wattserve serve`` flags and WATTSERVE_* variables are two spellings of one Settings model.

Every field must be a flag listed in ``serve --help``, a flag must give the same value as its
variable, a flag must win over the variable, and the other subcommands must still parse.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic.fields import FieldInfo
from wattserve.server import cli
from wattserve.server.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
FIELDS = list(Settings.model_fields)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No WATTSERVE_* variable from the caller's shell leaks into these comparisons."""
    for name in FIELDS:
        monkeypatch.delenv(f"WATTSERVE_{name.upper()}", raising=False)


def serve_settings(*flags: str) -> Settings:
    """Settings as ``wattserve serve FLAGS...`` would run with them (without serving)."""
    args = cli.build_parser().parse_args(["serve", *flags])
    assert args.func is cli.cmd_serve
    return cli.settings_from_args(args)


def _base_type(field: FieldInfo) -> Any:
    """The field's type without ``| None`` (and without Annotated metadata)."""
    annotation = field.annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    return annotation


def representative(name: str) -> tuple[list[str], str]:
    """A valid non-default value for the field: (serve flags, the same value as env text)."""
    field = Settings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    default = field.get_default(call_default_factory=True)
    kind = _base_type(field)
    if kind is bool:
        return ([f"--no-{flag[2:]}"], "false") if default else ([flag], "true")
    if typing.get_origin(kind) is Literal:
        text = next(choice for choice in typing.get_args(kind) if choice != default)
    elif kind is int:
        text = str(default + 1 if default is not None else 3)  # every int bound allows +1
    elif kind is float:
        text = str(default / 2 if default else 0.5)  # inside (0, 100) and >= 0 bounds
    elif kind == list[int]:
        text = "2,4"  # within the default max_batch_size, for preferred_batch_sizes
    elif kind == list[str]:
        text = {"rate_limit_resource": "R1:2,R2:1:0"}.get(name, "a,b")
    elif kind is Path:
        text = "/tmp/wattserve-flag-test"
    elif kind is str:
        text = {"model": "identity", "simulated_gpu": "superlinear", "cache_config": "local,size=4096"}.get(
            name, f"{name}-value"
        )
    else:
        raise AssertionError(f"no representative value for {name}: {field.annotation}; add one")
    return [flag, text], text


def test_every_setting_is_a_flag_in_serve_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["serve", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines; compare words
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert re.search(rf"{re.escape(flag)}\b", text), f"{flag} missing from serve --help"
        assert " ".join((field.description or "").split()) in text, f"{name}'s description missing"
        assert f"WATTSERVE_{name.upper()}" in text


@pytest.mark.parametrize("name", FIELDS)
def test_flag_and_env_var_give_the_same_value(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    flags, env_text = representative(name)
    if name == "load_model":  # Triton's rule: --load-model only with --model-control-mode=explicit
        monkeypatch.setenv("WATTSERVE_MODEL_CONTROL_MODE", "explicit")
    by_flag = getattr(serve_settings(*flags), name)
    monkeypatch.setenv(f"WATTSERVE_{name.upper()}", env_text)
    by_env = getattr(serve_settings(), name)
    assert by_flag == by_env
    assert by_flag != Settings.model_fields[name].get_default(call_default_factory=True)


def test_flag_wins_over_env_var_which_wins_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert serve_settings().port == 8000
    monkeypatch.setenv("WATTSERVE_PORT", "8100")
    monkeypatch.setenv("WATTSERVE_WARMUP", "false")
    monkeypatch.setenv("WATTSERVE_PREFERRED_BATCH_SIZES", "2,4")
    assert serve_settings().port == 8100
    chosen = serve_settings("--port", "8200", "--warmup", "--preferred-batch-sizes", "8")
    assert (chosen.port, chosen.warmup, chosen.preferred_batch_sizes) == (8200, True, [8])
    assert serve_settings("--no-warmup").warmup is False


def test_the_example_from_the_readme() -> None:
    chosen = serve_settings("--model", "resnet50", "--batcher", "static", "--max-batch-size", "8")
    assert (chosen.model, chosen.batcher, chosen.max_batch_size) == ("resnet50", "static", 8)


def test_an_invalid_value_names_flag_and_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WATTSERVE_MAX_BATCH_SIZE", "0")
    with pytest.raises(SystemExit) as done:
        serve_settings("--port", "eighty")
    assert done.value.code == 2
    error = capsys.readouterr().err
    assert "--port / WATTSERVE_PORT" in error and "'eighty'" in error
    assert "--max-batch-size / WATTSERVE_MAX_BATCH_SIZE" in error


def test_an_unknown_serve_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        serve_settings("--max-batchsize", "4")
    assert done.value.code == 2
    assert "--max-batchsize" in capsys.readouterr().err


def test_other_subcommands_keep_their_own_options() -> None:
    """loadgen's --model/--seed/--warmup are its own, not the server's settings."""
    from wattserve.loadgen import cli as loadgen_cli

    parser = cli.build_parser()
    load = parser.parse_args(["loadgen", "--model", "m", "--seed", "3", "--warmup", "1.5", "--rate", "5"])
    assert (load.func, load.model, load.seed, load.warmup) == (loadgen_cli.run_loadgen_command, "m", 3, 1.5)
    study = parser.parse_args(["study", "studies/example.toml", "--dry-run"])
    assert study.func is loadgen_cli.run_study_command and study.dry_run
    export = parser.parse_args(["export", "--model", "resnet50"])
    assert export.command == "export" and export.model == "resnet50"
    assert parser.parse_args(["settings"]).func is cli.cmd_settings


def _settings_table(text: str) -> list[str]:
    """The rows of the settings table: the lines after its header, up to the first non-row."""
    lines = text.splitlines()
    start = lines.index("| variable | flag | default | meaning |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_settings_table_lists_every_field_and_matches_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["settings"]) == 0
    rows = _settings_table(capsys.readouterr().out)
    assert [row.split("`")[1] for row in rows] == [f"WATTSERVE_{name.upper()}" for name in FIELDS]
    assert "| `--strict` `--no-strict` |" in rows[FIELDS.index("strict")]
    documented = _settings_table((ROOT / "docs" / "settings.md").read_text())
    assert documented == rows, "docs/settings.md's table is stale: paste `wattserve settings` into it"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--allow-client-shm=true"], True),  # Triton's form
        (["--allow-client-shm", "true"], True),  # Triton's getopt takes the value apart too
        (["--allow-client-shm=FALSE"], False),  # Triton's ParseOption<bool>: any case,
        (["--allow-client-shm=on"], True),  # on/off, 1/0
        (["--allow-client-shm", "0"], False),
        (["--allow-client-shm"], True),  # wattserve's forms still work
        (["--no-allow-client-shm"], False),
        (["--allow-client-shm", "--port", "8200"], True),  # a bare flag takes no next option
    ],
)
def test_bool_flags_take_tritons_true_false_values(flags: list[str], expected: bool) -> None:
    assert serve_settings(*flags).allow_client_shm is expected


@pytest.mark.parametrize("name", [n for n in FIELDS if _base_type(Settings.model_fields[n]) is bool])
def test_every_bool_flag_takes_an_explicit_value(name: str) -> None:
    flag = "--" + name.replace("_", "-")
    default = Settings.model_fields[name].get_default(call_default_factory=True)
    assert getattr(serve_settings(f"{flag}={str(not default).lower()}"), name) is (not default)
    assert getattr(serve_settings(f"{flag}={str(default).lower()}"), name) is default


@pytest.mark.parametrize("flags", [["--allow-client-shm=maybe"], ["--no-allow-client-shm=true"]])
def test_a_bad_bool_value_is_refused(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        serve_settings(*flags)
    assert done.value.code == 2
    assert "--allow-client-shm" in capsys.readouterr().err

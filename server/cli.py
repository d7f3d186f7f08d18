"""``wattserve`` command line: serve, settings, and the tools other modules register."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource
from wattserve.server.settings import Settings

SERVE_DESCRIPTION = (
    "Run the inference server. Every setting is a flag below and a WATTSERVE_* environment "
    "variable; a flag wins over the variable, the variable over the default."
)


def cmd_serve(args: argparse.Namespace) -> int:
    from wattserve.server.app import create_app
    from wattserve.server.lifecycle import DrainingServer, tune_malloc, uvicorn_config

    settings = settings_from_args(args)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if settings.frontend_workers > 1:  # front-end processes over one engine core (server/split/)
        from wattserve.server.split.supervisor import serve

        return serve(settings)
    if settings.tune_malloc:
        tune_malloc()
    sys.setswitchinterval(settings.gil_switch_interval_ms / 1000.0)
    app = create_app(settings)
    DrainingServer(uvicorn_config(app, settings), app.state.models, settings.drain_grace_s).run()
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    """Print every setting as a Markdown table (the README's table comes from here)."""
    flags = setting_flags(add_serve_parser(argparse.ArgumentParser().add_subparsers()))
    print("| variable | flag | default | meaning |")
    print("| --- | --- | --- | --- |")
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "" if default is None else f"`{default}`"
        flag = " ".join(f"`{option}`" for option in flags[name])
        print(f"| `WATTSERVE_{name.upper()}` | {flag} | {shown} | {field.description or ''} |")
    return 0


def add_serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``serve``: one flag per Settings field, made from the model by pydantic-settings."""
    serve = sub.add_parser(
        "serve", description=SERVE_DESCRIPTION, help="run the inference server (every setting a flag)"
    )
    flags: CliSettingsSource[argparse.ArgumentParser] = CliSettingsSource(
        Settings, root_parser=serve, add_argument_method=_add_setting_argument
    )
    serve.set_defaults(func=cmd_serve, settings_flags=flags)
    return serve


def triton_bool(text: str) -> bool:
    """A bool flag's value as Triton reads it (``ParseOption<bool>``): true/on/1, false/off/0,
    in any case."""
    word = text.lower()
    if word in ("true", "on", "1"):
        return True
    if word in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false (on/off, 1/0), got {text!r}")


class TritonBoolAction(argparse.Action):
    """A bool setting in both spellings its users know: ``--flag`` / ``--no-flag``, and
    Triton's ``--flag=true|false`` / ``--flag true|false`` (argparse's BooleanOptionalAction,
    which pydantic-settings makes, refuses a value: "ignored explicit argument 'true'")."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        negatives = [f"--no-{option[2:]}" for option in option_strings if option.startswith("--")]
        kwargs.update(nargs="?", type=triton_bool, metavar="BOOL")
        super().__init__([*option_strings, *negatives], dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        negative = bool(option_string and option_string.startswith("--no-"))
        if negative and values is not None:
            raise argparse.ArgumentError(self, f"{option_string} takes no value; use "
                                         f"{self.option_strings[0]}=true|false")  # fmt: skip
        setattr(namespace, self.dest, (not negative) if values is None else values)


class JoinedRepeats(argparse.Action):
    """A flag Triton lets its users repeat, one setting each time (``--cache-config
    redis,host=H --cache-config redis,port=P``): the values joined by ";"."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{seen};{values}" if isinstance(seen, str) and seen else values)


REPEATED = ("--cache-config",)


def _add_setting_argument(parser: argparse.ArgumentParser, *names: str, **kwargs: Any) -> argparse.Action:
    """pydantic-settings' add_argument, with Triton's ``=true/false`` accepted by bool flags
    and Triton's repeated flags joined."""
    if kwargs.get("action") is argparse.BooleanOptionalAction:
        kwargs = {**kwargs, "action": TritonBoolAction}
    if any(name in REPEATED for name in names) and kwargs.get("action") in (None, "store"):
        kwargs = {**kwargs, "action": JoinedRepeats}
    return parser.add_argument(*names, **kwargs)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings ``serve`` runs with: its flags, over WATTSERVE_*, over the defaults.

    A value that fails validation, from a flag or a variable, exits with status 2 (argparse's,
    as a bad flag always did) and one line that names it, rather than a traceback.
    """
    flags: CliSettingsSource[argparse.ArgumentParser] = args.settings_flags
    given = {name: value for name, value in vars(args).items() if name in Settings.model_fields}
    try:
        return Settings(_cli_settings_source=flags(parsed_args=given))
    except ValidationError as exc:
        parser = flags.root_parser
        parser.exit(2, f"{parser.prog}: error: {_describe(exc, setting_flags(parser))}\n")


def setting_flags(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Settings field -> its option strings in ``parser`` (``["--strict", "--no-strict"]``)."""
    return {a.dest: list(a.option_strings) for a in parser._actions if a.dest in Settings.model_fields}


def _describe(exc: ValidationError, flags: dict[str, list[str]]) -> str:
    """One clause per invalid setting, named both ways the user may have set it."""
    clauses = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else ""
        if name in flags:
            clauses.append(
                f"{flags[name][0]} / WATTSERVE_{name.upper()}: {error['msg']} (got {error['input']!r})"
            )
        else:
            clauses.append(error["msg"])
    return "; ".join(clauses)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wattserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    show = sub.add_parser(
        "settings", help="print every setting (WATTSERVE_* variable and serve flag) as a table"
    )
    show.set_defaults(func=cmd_settings)
    from wattserve.server.engine_commands import add_engine_commands

    add_engine_commands(sub)
    from wattserve.loadgen.cli import add_loadgen_parser, add_report_parser, add_study_parser  # lazy deps

    add_loadgen_parser(sub)
    add_study_parser(sub)
    add_report_parser(sub)
    from wattserve.loadgen.repository_check import add_repository_parser

    add_repository_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

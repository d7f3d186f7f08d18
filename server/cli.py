"""``wattserve`` command line: serve, settings, and the tools other modules register."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

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
    flags = CliSettingsSource(Settings, root_parser=serve)
    serve.set_defaults(func=cmd_serve, settings_flags=flags)
    return serve


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings ``serve`` runs with: its flags, over WATTSERVE_*, over the defaults.

    A value that fails validation, from a flag or a variable, exits with status 2 (argparse's,
    as a bad flag always did) and one line that names it, rather than a traceback.
    """
    flags: CliSettingsSource[Settings] = args.settings_flags
    given = {name: value for name, value in vars(args).items() if name in Settings.model_fields}
    try:
        return Settings(_cli_settings_source=flags(parsed_args=given))
    except ValidationError as exc:
        parser = flags.root_parser
        parser.exit(2, f"{parser.prog}: error: {_describe(exc, setting_flags(parser))}\n")


def setting_flags(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Settings field -> its option strings in ``parser`` (``["--strict", "--no-strict"]``)."""
    return {a.dest: a.option_strings for a in parser._actions if a.dest in Settings.model_fields}


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
    _add_engine_tools(sub)
    from wattserve.loadgen.cli import add_loadgen_parser, add_study_parser  # imports its deps lazily

    add_loadgen_parser(sub)
    add_study_parser(sub)
    return parser


def _add_engine_tools(sub: argparse._SubParsersAction) -> None:
    """``export`` (torch -> ONNX) and ``build-engine`` (ONNX -> TensorRT plan)."""
    from wattserve.engines import tensorrt_engine
    from wattserve.server.repository import export as repository_export

    export = sub.add_parser("export", help="export a torchvision model to ONNX (dynamic batch axis), "
                            "optionally as a Triton repository entry")  # fmt: skip
    repository_export.add_arguments(export)
    export.set_defaults(func=repository_export.run)
    build = sub.add_parser("build-engine", help="build a TensorRT plan with min/opt/max batch profiles")
    tensorrt_engine.add_arguments(build)
    build.set_defaults(func=tensorrt_engine.run)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

"""``wattserve`` command line: serve, settings, and the tools other modules register."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from wattserve.server.settings import Settings


def cmd_serve(args: argparse.Namespace) -> int:
    from wattserve.server.app import create_app
    from wattserve.server.lifecycle import DrainingServer, tune_malloc, uvicorn_config

    given = (("host", args.host), ("port", args.port), ("model_repository", args.model_repository),
             ("strict", args.strict or None))  # fmt: skip
    overrides = {k: v for k, v in given if v is not None}
    settings = Settings(**overrides)
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
    print("| variable | default | meaning |")
    print("| --- | --- | --- |")
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "" if default is None else f"`{default}`"
        print(f"| `WATTSERVE_{name.upper()}` | {shown} | {field.description or ''} |")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wattserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the inference server (settings from WATTSERVE_*)")
    serve.add_argument("--host", default=None, help="overrides WATTSERVE_HOST")
    serve.add_argument("--port", type=int, default=None, help="overrides WATTSERVE_PORT")
    serve.add_argument(
        "--model-repository",
        default=None,
        help="Triton-layout model repository; overrides WATTSERVE_MODEL_REPOSITORY",
    )
    serve.add_argument("--strict", action="store_true",
                       help="exit if any model fails to load (Triton's --exit-on-error)")  # fmt: skip
    serve.set_defaults(func=cmd_serve)
    show = sub.add_parser("settings", help="print every WATTSERVE_* setting as a table")
    show.set_defaults(func=cmd_settings)
    from wattserve.server.engine_commands import add_engine_commands

    add_engine_commands(sub)
    from wattserve.loadgen.cli import add_loadgen_parser, add_study_parser  # imports its deps lazily

    add_loadgen_parser(sub)
    add_study_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

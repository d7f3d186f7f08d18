"""Triton's trace and logging extensions, backed by what wattserve has.

Trace settings (``/v2[/models/{m}]/trace/setting``, gRPC TraceSetting) are stored and
reported with Triton's shapes and update rules: a model's setting overrides the global one
field by field, a cleared (null) field falls back to the global value, a cleared global
field to the start-up default. wattserve writes no trace files: its per-request timing is in
the X-Queue-Time-Ms / X-Compute-Time-Ms headers and the Prometheus metrics.

Log settings (``/v2/logging``, gRPC LogSettings) drive Python's logging: ``log_info``,
``log_warning`` and ``log_error`` switch those record levels on or off (a filter on the
root and uvicorn handlers), ``log_verbose_level`` > 0 turns on DEBUG records, and
``log_format`` ISO8601 makes handlers' timestamps ISO 8601 UTC. Messages follow Triton's
``http_server.cc`` and ``grpc_server.cc``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from wattserve.server.extensions.errors import ExtensionError
from wattserve.server.models.model_set import ModelSet, ModelState, UnknownModel

TRACE_DEFAULTS: dict[str, Any] = {
    "trace_file": "",
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_mode": "triton",
}
TRACE_LEVELS = ("OFF", "TIMESTAMPS")  # TENSORS: wattserve cannot record tensors
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1


class TraceSettings:
    """Global and per-model trace settings (stored; see the module docstring)."""

    def __init__(self) -> None:
        self._global: dict[str, Any] = {}
        self._models: dict[str, dict[str, Any]] = {}

    def get(self, model: str | None = None) -> dict[str, Any]:
        doc = {**TRACE_DEFAULTS, **self._global, **(self._models.get(model, {}) if model else {})}
        return {k: list(v) if isinstance(v, list) else v for k, v in doc.items()}

    def update(self, model: str | None, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (a value of None clears the field) and return the result.
        Nothing changes unless every field is valid."""
        if "trace_file" in changes:
            raise ExtensionError(
                "trace file location can not be updated through network protocol", "unsupported"
            )
        parsed: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in ("trace_level", "trace_rate", "trace_count", "log_frequency"):
                raise ExtensionError(f"unknown trace setting '{key}'")
            parsed[key] = None if value is None else _parse_trace_value(key, value)
        target = self._models.setdefault(model, {}) if model else self._global
        for key, value in parsed.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
        return self.get(model)


def _parse_trace_value(key: str, value: Any) -> Any:
    if key == "trace_level":
        levels = [value] if isinstance(value, str) else value
        if not isinstance(levels, list) or not levels or not all(isinstance(v, str) for v in levels):
            raise ExtensionError("'trace_level' must be a list of strings")
        if "OFF" in levels and len(levels) > 1:
            raise ExtensionError("Expect only one trace level 'OFF' is specified")
        unknown = [v for v in levels if v not in TRACE_LEVELS]
        if unknown:
            raise ExtensionError(
                f"trace level {unknown[0]!r} is not supported; wattserve takes {list(TRACE_LEVELS)}"
            )
        return list(dict.fromkeys(levels))
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str):
        raise ExtensionError(f"Unable to parse '{key}', got: {value!r}")
    try:
        number = int(text.strip())
    except ValueError:
        raise ExtensionError(f"Unable to parse '{key}', got: {text}") from None
    low, high = (-1, INT32_MAX) if key == "trace_count" else (0, UINT32_MAX)
    if key == "trace_count" and number < low:
        raise ExtensionError(f"Unable to parse '{key}'. Expecting value >= {low}, got: {text}")
    if not low <= number <= high:
        raise ExtensionError(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text}")
    return str(number)


class _LevelSwitch(logging.Filter):
    """Passes a record when its level's switch is on (Triton's switches are independent,
    so a threshold alone cannot express e.g. info on, warning off)."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__("wattserve-log-settings")
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        s, level = self.settings, record.levelno
        if level < logging.INFO:  # DEBUG records: gated by the root level (``apply``)
            return True
        if level < logging.WARNING:
            return s.info
        if level < logging.ERROR:
            return s.warning
        return s.error


ISO8601 = "%Y-%m-%dT%H:%M:%SZ"


class LogSettings:
    """Triton's log switches over Python logging (see the module docstring)."""

    LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")  # whose handlers obey

    def __init__(self, log_level: str = "info") -> None:
        level = logging.getLevelName(log_level.upper())
        level = level if isinstance(level, int) else logging.INFO
        self.verbose = 1 if level < logging.INFO else 0
        self.info = level <= logging.INFO
        self.warning = level <= logging.WARNING
        self.error = level <= logging.ERROR
        self.format = "default"
        self._switch = _LevelSwitch(self)
        self._formats: dict[int, tuple[logging.Formatter, str | None, Any]] = {}
        self._root_level: int | None = None

    def get(self) -> dict[str, Any]:
        return {"log_file": "", "log_info": self.info, "log_warning": self.warning, "log_error": self.error,
                "log_verbose_level": self.verbose, "log_format": self.format}  # fmt: skip

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (None leaves a field as it is, as Triton) and return the result."""
        if changes.get("log_file") is not None:
            raise ExtensionError(
                "log file location can not be updated through network protocol", "unsupported"
            )
        new = {}
        for key, value in changes.items():
            if value is None or key == "log_file":
                continue
            if key in ("log_info", "log_warning", "log_error"):
                if not isinstance(value, bool):
                    raise ExtensionError(f"Unable to parse '{key}': expected a boolean, got {value!r}")
            elif key == "log_verbose_level":
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT32_MAX:
                    raise ExtensionError(
                        f"Unable to parse '{key}': expected a non-negative integer, got {value!r}"
                    )
            elif key == "log_format":
                if value not in ("default", "ISO8601"):
                    raise ExtensionError(f"invalid argument for --log_format, got: {value}")
            else:
                raise ExtensionError(f"unknown log setting '{key}'")
            new[key] = value
        self.info = new.get("log_info", self.info)
        self.warning = new.get("log_warning", self.warning)
        self.error = new.get("log_error", self.error)
        self.verbose = new.get("log_verbose_level", self.verbose)
        self.format = new.get("log_format", self.format)
        self.apply()
        return self.get()

    def apply(self) -> None:
        """Install the switch on the handlers there are now, open the root logger to DEBUG
        while verbose, and set the handlers' timestamp format."""
        root = logging.getLogger()
        if self._root_level is None:
            self._root_level = root.level
        quiet = max(self._root_level, logging.INFO)  # verbose 0: no DEBUG records
        root.setLevel(
            logging.DEBUG
            if self.verbose > 0
            else quiet
            if self._root_level < logging.INFO
            else self._root_level
        )
        switched = not (self.info and self.warning and self.error)  # all on: leave handlers alone
        for name in self.LOGGERS:
            for handler in logging.getLogger(name).handlers:
                if switched and self._switch not in handler.filters:
                    handler.addFilter(self._switch)
                elif not switched:
                    handler.removeFilter(self._switch)
                self._set_time_format(handler)

    def _set_time_format(self, handler: logging.Handler) -> None:
        formatter = handler.formatter
        if formatter is None:
            return
        key = id(formatter)
        if key not in self._formats:
            self._formats[key] = (formatter, formatter.datefmt, formatter.converter)
        _, datefmt, converter = self._formats[key]
        if self.format == "ISO8601":
            formatter.datefmt, formatter.converter = ISO8601, time.gmtime
        else:
            formatter.datefmt, formatter.converter = datefmt, converter


def check_model_ready(models: ModelSet, name: str) -> None:
    """Triton answers trace settings only for a ready model."""
    try:
        entry = models.lookup(name, None)
    except UnknownModel:
        entry = None
    if entry is None or entry.state is not ModelState.READY:
        raise ExtensionError(f"Request for unknown model : {name}")

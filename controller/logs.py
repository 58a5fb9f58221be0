"""Structured logs for the controller process.

Lifecycle log lines carry their subject as record attributes (``extra={"pod": ..., "node":
..., "claim": ...}``, see :data:`CONTEXT_KEYS`). With ``--log-format json`` every line is one
JSON object: ``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``message``, the
context keys that are set, and ``error`` (the formatted traceback) when there is one. With the
default ``text`` format the context is appended as ``key=value``.

:func:`configure` swaps the formatter of the root logger's handlers (the CLI sets the
handlers and levels up) and stops records gathering what neither format writes (the thread,
the process, the caller's file, function and line: logging's documented switches, a third of
a record's cost, 12.8 -> 9.4 us a line with a line per bound pod); it is idempotent.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Final, Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final = ("text", "json")
CONTEXT_KEYS: Final = ("pod", "node", "claim", "device")
_TEXT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _context(record: logging.LogRecord) -> dict[str, str]:
    return {k: str(v) for k in CONTEXT_KEYS if (v := getattr(record, k, None)) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = dt.datetime.fromtimestamp(record.created, dt.UTC)
        out: dict[str, str] = {
            "time": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """The usual one-line format, with the context appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(_TEXT)
        self._second: tuple[int, str] = (-1, "")  # a second and its time text

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        """As :class:`logging.Formatter` writes it, the text of each second made once (the
        conversion and ``strftime`` were a third of a line's cost, with a line per bound pod)."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        whole = int(record.created)
        second = self._second
        if second[0] != whole:
            second = (whole, time.strftime(self.default_time_format, self.converter(whole)))
            self._second = second
        return f"{second[1]},{int(record.msecs):03d}"  # (the default_msec_format)

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            line = super().format(record)
        else:
            # What logging.Formatter.format makes of _TEXT for a record with no traceback or
            # stack to append, without its generic steps (the format searched for asctime, then
            # applied to the record's __dict__): 4.1 -> 2.5 us a line, with a line per pod.
            record.message = record.getMessage()
            record.asctime = self.formatTime(record)
            line = f"{record.asctime} {record.levelname} {record.name}: {record.message}"
        context = _context(record)
        if not context:
            return line
        head, sep, tail = line.partition("\n")
        pairs = " ".join(f"{k}={v}" for k, v in context.items())
        return f"{head} {pairs}{sep}{tail}"


def configure(log_format: LogFormat) -> None:
    """Use ``log_format`` on every handler of the root logger; records leave out what no
    format here writes (module docstring)."""
    formatter: logging.Formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # (no stack walk to find the caller)

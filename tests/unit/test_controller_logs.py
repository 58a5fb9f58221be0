"""Structured logs (controller.logs): JSON lines with the pod/node/claim context, text lines
with the context appended, tracebacks kept."""

from __future__ import annotations

import json
import logging
import sys

from controller.logs import JsonFormatter, TextFormatter


def record(**extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(
        "controller.commit", logging.INFO, __file__, 1, "pod %s: bound", ("ns/p",), None
    )
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_json_lines_carry_the_context() -> None:
    line = JsonFormatter().format(record(pod="ns/p", node="n1"))
    parsed = json.loads(line)
    assert parsed["message"] == "pod ns/p: bound"
    assert (parsed["level"], parsed["logger"]) == ("INFO", "controller.commit")
    assert (parsed["pod"], parsed["node"]) == ("ns/p", "n1")
    assert "claim" not in parsed
    assert parsed["time"].endswith("Z")


def _fail() -> None:
    raise ValueError("boom")


def test_json_lines_keep_the_traceback() -> None:
    rec = record()
    try:
        _fail()
    except ValueError:
        rec.exc_info = sys.exc_info()
    parsed = json.loads(JsonFormatter().format(rec))
    assert "ValueError: boom" in parsed["error"]


def test_text_lines_append_the_context() -> None:
    line = TextFormatter().format(record(claim="ns/c"))
    assert line.endswith("controller.commit: pod ns/p: bound claim=ns/c")


def test_text_lines_give_the_time_as_the_standard_formatter_does() -> None:
    formatter, standard = TextFormatter(), logging.Formatter("%(asctime)s")
    for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25):
        rec = record()
        rec.created, rec.msecs = created, (created - int(created)) * 1000
        assert formatter.formatTime(rec) == standard.formatTime(rec)
    assert formatter.formatTime(rec, "%Y") == standard.formatTime(rec, "%Y")

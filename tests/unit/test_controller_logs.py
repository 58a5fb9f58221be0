"""Structured logs (controller.logs): JSON lines with the pod/node/claim context, text lines
with the context appended, tracebacks kept."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

import pytest

from controller.logs import JsonFormatter, TextFormatter, configure


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


@pytest.mark.parametrize(
    ("msg", "args", "extra"),
    [
        ("pod %s: bound", ("ns/p",), {"pod": "ns/p", "node": "n1"}),
        ("no context", (), {}),
        ("two\nlines %d%%", (5,), {"claim": "ns/c", "device": 0}),
        ("%(a)s", ({"a": "mapping"},), {"pod": None}),
        ("{} not %-style", (), {"node": "n\n2"}),
    ],
)
def test_text_lines_read_as_the_standard_formatter_writes_them(
    msg: str, args: tuple[object, ...], extra: dict[str, object]
) -> None:
    """The line without a traceback is built directly: it reads as logging.Formatter's."""
    rec = logging.LogRecord("biaxial.x", logging.WARNING, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    standard = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    head, sep, tail = standard.format(rec).partition("\n")
    pairs = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
    assert TextFormatter().format(rec) == (
        f"{head} {pairs}{sep}{tail}" if pairs else head + sep + tail
    )


def test_text_lines_give_the_time_as_the_standard_formatter_does() -> None:
    formatter, standard = TextFormatter(), logging.Formatter("%(asctime)s")
    for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25):
        rec = record()
        rec.created, rec.msecs = created, (created - int(created)) * 1000
        assert formatter.formatTime(rec) == standard.formatTime(rec)
    assert formatter.formatTime(rec, "%Y") == standard.formatTime(rec, "%Y")


def test_configure_leaves_the_lines_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records stop gathering thread, process and caller (module docstring): every line of
    either format reads the same as before, tracebacks included."""
    for name in ("logThreads", "logProcesses", "logMultiprocessing", "_srcfile"):
        monkeypatch.setattr(logging, name, getattr(logging, name))
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    monkeypatch.setattr(root, "handlers", [handler])
    log = logging.getLogger("biaxial.controller.commit")
    monkeypatch.setattr(log, "level", logging.INFO)

    def lines() -> list[str]:
        for formatter in (JsonFormatter(), TextFormatter()):
            handler.setFormatter(formatter)
            log.info("pod %s: bound", "ns/p", extra={"pod": "ns/p", "node": "n1"})
            try:
                _fail()
            except ValueError:
                log.exception("pod %s: failed", "ns/p", extra={"pod": "ns/p"})
        text = stream.getvalue()
        stream.seek(0)
        stream.truncate()
        # (the time differs from one call to the next)
        return [re.sub(r"\d{4}-\d\d-\d\d[T ][\d:.,]+Z?", "T", line) for line in text.splitlines()]

    before = lines()
    configure("text")
    assert lines() == before
    assert (logging.logThreads, logging.logProcesses, logging._srcfile) == (False, False, None)

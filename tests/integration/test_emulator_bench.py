"""The emulator benchmark runs end to end (tiny sizes) and prints its one table."""

from __future__ import annotations

from bench import emulator as bench


def test_benchmark_rows_and_table() -> None:
    rows = bench.run(count=20, objects=5, in_process=True)
    names = [name for name, *_ in rows]
    assert names == [
        "create",
        "get",
        "patch (strategic merge)",
        "list (5 claims, raw JSON)",
        "watch delivery (create -> ADDED)",
    ]
    for name, calls, elapsed, samples in rows:
        assert calls > 0, name
        assert elapsed > 0, name
        assert len(samples) == calls, name
    table = bench._table(rows, "thread in this process")
    assert table.splitlines()[1].split() == [
        "operation",
        "calls",
        "calls/s",
        "p50",
        "ms",
        "p99",
        "ms",
    ]
    assert len(table.splitlines()) == 3 + len(rows)

"""The fault and bad-input harnesses (``bench/chaos.py``, ``bench/badinput.py``) at a small
size: the real controller and plugin processes against the API emulator, loopback only. The
full-size figures are the harnesses' own to report (``make bench-chaos``,
``make bench-badinput``); here the books must balance and every message must be seen."""

from __future__ import annotations

import argparse

from bench import badinput, chaos


def test_every_bad_input_is_reported_where_the_user_looks_and_changes_nothing_else() -> None:
    report = badinput.run_all(argparse.Namespace(decision_timeout=1.0, keep=False))
    cases = {c["case"]: c for c in report["cases"]}
    assert len(cases) == 20
    for name, case in cases.items():
        assert case["where"] != "NOT SEEN", (name, case["message"])
        assert case["unchanged"], (name, case["notes"])
        assert case["ordinary_s"] is not None, name
    assert cases["unknown policy"]["message"] == (
        "annotation biaxial.dev/gpu-policy: unknown policy 'tight' (allowed: binpack, spread)"
    )
    assert "1 s deadline" in cases["CEL selector only the deadline stops"]["message"]
    assert "actual cost limit exceeded" in cases["CEL growth bomb (stored class)"]["message"]
    assert "Prepare is refused" in cases["corrupt checkpoint"]["message"]
    assert (
        "nest deeper than 64 levels"
        in cases["claim nested 5,000 deep (accepted by the API)"]["message"]
    )
    assert "(200000 characters)" in cases["200 KB annotation value"]["message"]
    assert len(cases["200 KB annotation value"]["message"]) < 300
    assert "(422 Invalid)" in cases["commit refused for good (422)"]["message"]
    assert cases["10 pods on one claim in one burst"]["where"] == "all bound"
    assert report["refused_claims_touched"] == []
    assert report["invariant_violations"] == []
    assert report["controller_alive"]
    assert report["controller_peak_rss_mib"] < report["controller_memory_limit_mib"]


def test_a_short_fault_run_balances_its_books() -> None:
    args = chaos.parse_args(
        [
            "--pods", "40", "--alive", "12", "--nodes", "2",
            "--fault-interval", "0.15", "--kill-interval", "3", "--pause-interval", "5",
            "--min-seconds", "16", "--settle", "90", "--seed", "7",
        ]
    )  # fmt: skip
    report = chaos.run(args)
    assert report["double_allocations"] == []
    assert report["stuck_pods"] == []
    assert report["leaks"] == []
    assert not any(report["prepared_left"].values())
    assert report["converged_bound_s"] is not None
    assert report["converged_released_s"] is not None
    assert chaos.passed(report)
    assert report["pods"] >= 40
    assert sum(report["kills"].values()) >= 1
    assert report["pauses"] >= 1
    # The paused leader noticed it had lost the lease and exited non-zero (never 0).
    assert 0 not in report["controller_exits"]
    assert report["faults"]["total"] > 0

"""Controller settings: flags beat environment twins beat defaults; every bad value is one
clear line and exit code 2 from ``biaxial controller``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from biaxial.cli import main
from biaxial.commands import controller as command
from controller.settings import Settings
from driver.api.errors import InvalidInputError


def parse(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.settings_from_args(parser.parse_args(list(argv)))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for flag in command.FLAGS:
        for env in (flag.env, *flag.conventional_env):
            monkeypatch.delenv(env, raising=False)


def test_defaults() -> None:
    s = parse()
    assert (s.scheduler_name, s.driver_name, s.qps, s.burst) == (
        "biaxial",
        "gpu.biaxial.dev",
        100.0,
        200,
    )
    assert s.leader_elect
    assert s.finalizer == "gpu.biaxial.dev/allocation"
    assert (s.policies.node, s.policies.gpu) == ("binpack", "binpack")


def test_flags_beat_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    monkeypatch.setenv("BIAXIAL_QPS", "7")
    monkeypatch.setenv("BIAXIAL_BURST", "9")
    monkeypatch.setenv("BIAXIAL_GPU_POLICY", "spread")
    monkeypatch.setenv("BIAXIAL_LEADER_ELECT", "false")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    s = parse("--qps", "50", "--node-policy", "spread")
    assert (s.qps, s.burst) == (50.0, 9)
    assert (s.policies.node, s.policies.gpu) == ("spread", "spread")
    assert not s.leader_elect
    assert s.kubeconfig == str(kubeconfig)
    assert parse("--leader-elect").leader_elect


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--qps", "0"], "--qps must be > 0"),
        (["--qps", "fast"], "--qps: 'fast' is not a number"),
        (["--burst", "1.5"], "--burst: '1.5' is not an integer"),
        (["--driver-name", "Not_A_Name"], "--driver-name"),
        (["--lease-namespace", "a.b"], "--lease-namespace"),
        (["--lease-duration", "5", "--renew-deadline", "6"], "renew deadline < lease duration"),
        (["--metrics-port", "70000"], "--metrics-port must be in 0..65535"),
        (["--node-policy", "pack"], "unknown policy 'pack'"),
        (["--kubeconfig", "/no/such/file"], "no such file"),
        (["--log-format", "xml"], "--log-format: 'xml' is not one of text, json"),
        (["--admission-webhook-port", "-1"], "--admission-webhook-port must be in 0..65535"),
        (
            ["--admission-webhook-port", "9443"],
            "--admission-tls-cert-file: the admission webhook is served over HTTPS only",
        ),
        (
            ["--admission-webhook-port", "8080"],
            "--admission-webhook-port and --metrics-port are both 8080",
        ),
    ],
)
def test_bad_values_are_clear_errors(argv: list[str], message: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse(*argv)
    assert message in str(info.value)


def test_cli_reports_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["controller", "--qps", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "biaxial controller: error: --qps must be > 0, got -1.0 "
        "(from the flag; environment twin $BIAXIAL_QPS)\n"
    )


def test_settings_are_frozen() -> None:
    s = Settings().validate()
    with pytest.raises(AttributeError):
        s.qps = 1.0  # type: ignore[misc]


def test_the_webhook_needs_its_certificate_and_real_scheduler_names(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.touch()
    key.touch()
    files = ["--admission-tls-cert-file", str(cert), "--admission-tls-private-key-file", str(key)]
    s = parse("--admission-webhook-port", "9443", *files)
    assert s.admission_webhook_port == 9443
    assert s.admission_schedulers == (
        "default-scheduler",
        "hami-scheduler",
        "volcano",
        "kai-scheduler",
    )
    for given, message in (
        (" , ", "--admission-schedulers: name at least one scheduler to take over"),
        ("volcano,Not A Scheduler", "--admission-schedulers: 'Not A Scheduler' is not a"),
    ):
        with pytest.raises(InvalidInputError, match=message):
            parse("--admission-webhook-port", "9443", *files, "--admission-schedulers", given)

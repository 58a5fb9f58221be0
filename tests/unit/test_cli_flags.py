"""The one flag/environment convention of ``biaxial controller`` and ``biaxial kubelet-plugin``
(biaxial.flags): every flag and its environment twin work (they are contracts: the Helm chart
and deploy/manifests use them); the flag wins over the twin, the twin over the conventional
variable, that over the default; bad values are one line naming the flag and where the value
came from, exit code 2; both commands document it in --help and log at INFO by default."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from biaxial import flags as flags_module
from biaxial.cli import build_parser, main
from biaxial.commands import controller as controller_cmd
from biaxial.commands import kubelet_plugin as plugin_cmd
from controller.settings import Settings as ControllerSettings
from driver.api.errors import ConfigError, InvalidInputError, PolicyError
from kubeletplugin.settings import Settings as PluginSettings

UID = "0f5c1e9e-2f3a-4a57-9d1e-1c2b3d4e5f60"
KUBECONFIG = "<kubeconfig>"  # replaced by a real file


@dataclasses.dataclass(frozen=True)
class Case:
    flag: str
    env: str  # the environment twin, spelled out: it is a contract
    text: str
    read: Callable[[Any], Any]
    expected: Any


CONTROLLER = [
    Case("kubeconfig", "BIAXIAL_KUBECONFIG", KUBECONFIG, lambda s: s.kubeconfig, KUBECONFIG),
    Case("node-policy", "BIAXIAL_NODE_POLICY", "spread", lambda s: s.policies.node, "spread"),
    Case("gpu-policy", "BIAXIAL_GPU_POLICY", "first-fit", lambda s: s.policies.gpu, "first-fit"),
    Case(
        "default-spread-constraints",
        "BIAXIAL_DEFAULT_SPREAD_CONSTRAINTS",
        "topology.kubernetes.io/zone:2:DoNotSchedule",
        lambda s: s.spreading.describe(),
        "topology.kubernetes.io/zone:2:DoNotSchedule",
    ),
    Case("qps", "BIAXIAL_QPS", "7.5", lambda s: s.qps, 7.5),
    Case("burst", "BIAXIAL_BURST", "9", lambda s: s.burst, 9),
    Case("scheduler-name", "BIAXIAL_SCHEDULER_NAME", "other", lambda s: s.scheduler_name, "other"),
    Case("driver-name", "BIAXIAL_DRIVER_NAME", "gpu.x.io", lambda s: s.driver_name, "gpu.x.io"),
    Case("leader-elect", "BIAXIAL_LEADER_ELECT", "false", lambda s: s.leader_elect, False),
    Case("lease-namespace", "BIAXIAL_LEASE_NAMESPACE", "ns1", lambda s: s.lease_namespace, "ns1"),
    Case("lease-name", "BIAXIAL_LEASE_NAME", "lease1", lambda s: s.lease_name, "lease1"),
    Case("lease-duration", "BIAXIAL_LEASE_DURATION", "20", lambda s: s.lease_duration_s, 20.0),
    Case("renew-deadline", "BIAXIAL_RENEW_DEADLINE", "12", lambda s: s.renew_deadline_s, 12.0),
    Case("retry-period", "BIAXIAL_RETRY_PERIOD", "3", lambda s: s.retry_period_s, 3.0),
    Case("identity", "BIAXIAL_IDENTITY", "me", lambda s: s.identity, "me"),
    Case("metrics-port", "BIAXIAL_METRICS_PORT", "0", lambda s: s.metrics_port, 0),
    Case(
        "metrics-bind-address",
        "BIAXIAL_METRICS_BIND_ADDRESS",
        "::1",
        lambda s: s.metrics_bind_address,
        "::1",
    ),
    Case("metrics-auth", "BIAXIAL_METRICS_AUTH", "none", lambda s: s.metrics_auth, "none"),
    Case("tls-cert-file", "BIAXIAL_TLS_CERT_FILE", "/c.pem", lambda s: s.tls_cert_file, "/c.pem"),
    Case(
        "tls-private-key-file",
        "BIAXIAL_TLS_PRIVATE_KEY_FILE",
        "/k.pem",
        lambda s: s.tls_private_key_file,
        "/k.pem",
    ),
    Case("health-port", "BIAXIAL_HEALTH_PORT", "9401", lambda s: s.health_port, 9401),
    Case(
        "health-bind-address",
        "BIAXIAL_HEALTH_BIND_ADDRESS",
        "10.0.0.1",
        lambda s: s.health_bind_address,
        "10.0.0.1",
    ),
    # (a port other than 0 needs the certificate files: test_settings' webhook cases)
    Case(
        "admission-webhook-port",
        "BIAXIAL_ADMISSION_WEBHOOK_PORT",
        "0",
        lambda s: s.admission_webhook_port,
        0,
    ),
    Case(
        "admission-webhook-bind-address",
        "BIAXIAL_ADMISSION_WEBHOOK_BIND_ADDRESS",
        "10.0.0.3",
        lambda s: s.admission_webhook_bind_address,
        "10.0.0.3",
    ),
    Case(
        "admission-tls-cert-file",
        "BIAXIAL_ADMISSION_TLS_CERT_FILE",
        "/a.pem",
        lambda s: s.admission_tls_cert_file,
        "/a.pem",
    ),
    Case(
        "admission-tls-private-key-file",
        "BIAXIAL_ADMISSION_TLS_PRIVATE_KEY_FILE",
        "/ak.pem",
        lambda s: s.admission_tls_private_key_file,
        "/ak.pem",
    ),
    Case(
        "admission-schedulers",
        "BIAXIAL_ADMISSION_SCHEDULERS",
        "volcano, kai-scheduler",
        lambda s: s.admission_schedulers,
        ("volcano", "kai-scheduler"),
    ),
    Case("log-format", "BIAXIAL_LOG_FORMAT", "json", lambda s: s.log_format, "json"),
    Case(
        "decision-timeout",
        "BIAXIAL_DECISION_TIMEOUT",
        "2.5",
        lambda s: s.decision_timeout_s,
        2.5,
    ),
    Case(
        "max-concurrent-writes",
        "BIAXIAL_MAX_CONCURRENT_WRITES",
        "4",
        lambda s: s.max_concurrent_writes,
        4,
    ),
    Case("binding-timeout", "BIAXIAL_BINDING_TIMEOUT", "30", lambda s: s.binding_timeout_s, 30.0),
    Case(
        "volume-bind-timeout",
        "BIAXIAL_VOLUME_BIND_TIMEOUT",
        "30",
        lambda s: s.volume_bind_timeout_s,
        30.0,
    ),
]
PLUGIN = [
    Case("kubeconfig", "BIAXIAL_KUBECONFIG", KUBECONFIG, lambda s: s.kubeconfig, KUBECONFIG),
    Case("node-name", "BIAXIAL_NODE_NAME", "n2", lambda s: s.node_name, "n2"),
    Case("fake-gpus", "BIAXIAL_FAKE_GPUS", "t4x4", lambda s: s.fake_gpus, "t4x4"),
    # an existing directory; needs --fake-gpus (set for it below)
    Case("fake-device-dir", "BIAXIAL_FAKE_DEVICE_DIR", "/", lambda s: s.fake_device_dir, Path("/")),
    Case("driver-name", "BIAXIAL_DRIVER_NAME", "gpu.x.io", lambda s: s.driver_name, "gpu.x.io"),
    Case("registry-dir", "BIAXIAL_REGISTRY_DIR", "/r", lambda s: s.registry_dir, Path("/r")),
    Case("plugin-dir", "BIAXIAL_PLUGIN_DIR", "/p", lambda s: s.plugin_dir, Path("/p")),
    Case("cdi-dir", "BIAXIAL_CDI_DIR", "/c", lambda s: s.cdi_dir, Path("/c")),
    Case("state-dir", "BIAXIAL_STATE_DIR", "/s", lambda s: s.state_dir, Path("/s")),
    Case("pod-uid", "BIAXIAL_POD_UID", UID, lambda s: s.pod_uid, UID),
    Case("metrics-port", "BIAXIAL_METRICS_PORT", "9400", lambda s: s.metrics_port, 9400),
    Case(
        "metrics-address",
        "BIAXIAL_METRICS_ADDRESS",
        "0.0.0.0",
        lambda s: s.metrics_address,
        "0.0.0.0",
    ),
    Case("health-port", "BIAXIAL_HEALTH_PORT", "9402", lambda s: s.health_port, 9402),
    Case(
        "health-address",
        "BIAXIAL_HEALTH_ADDRESS",
        "10.0.0.2",
        lambda s: s.health_address,
        "10.0.0.2",
    ),
    Case(
        "remove-slices-on-exit",
        "BIAXIAL_REMOVE_SLICES_ON_EXIT",
        "true",
        lambda s: s.remove_slices_on_exit,
        True,
    ),
    Case(
        "advertise-legacy-resources",
        "BIAXIAL_ADVERTISE_LEGACY_RESOURCES",
        "true",
        lambda s: s.advertise_legacy_resources,
        True,
    ),
    Case(
        "hami-core-library",
        "BIAXIAL_HAMI_CORE_LIBRARY",
        "/lib/libvgpu.so",
        lambda s: s.hami_core_library_path,
        Path("/lib/libvgpu.so"),
    ),
    Case("mps-root", "BIAXIAL_MPS_ROOT", "/m", lambda s: s.mps_root, Path("/m")),
    Case(
        "dynamic-mig",
        "BIAXIAL_DYNAMIC_MIG",
        "NVIDIA A100-SXM4-80GB",
        lambda s: s.dynamic_mig.models,
        {"NVIDIA A100-SXM4-80GB"},
    ),
    Case(
        "max-shares-per-gpu",
        "BIAXIAL_MAX_SHARES_PER_GPU",
        "8",
        lambda s: s.max_shares_per_gpu,
        8,
    ),
    Case(
        "share-strategies",
        "BIAXIAL_SHARE_STRATEGIES",
        "none, hami-core",
        lambda s: s.share_strategies,
        ("hami-core", "none"),
    ),
    Case(
        "health-resend-seconds",
        "BIAXIAL_HEALTH_RESEND_SECONDS",
        "5",
        lambda s: s.health_resend_s,
        5.0,
    ),
    Case(
        "health-check-timeout-seconds",
        "BIAXIAL_HEALTH_CHECK_TIMEOUT_SECONDS",
        "40",
        lambda s: s.health_check_timeout_s,
        40,
    ),
    Case("xid-quiet-seconds", "BIAXIAL_XID_QUIET_SECONDS", "120", lambda s: s.xid_quiet_s, 120.0),
    Case("rediscover-seconds", "BIAXIAL_REDISCOVER_SECONDS", "30", lambda s: s.rediscover_s, 30.0),
    Case("resync-seconds", "BIAXIAL_RESYNC_SECONDS", "30", lambda s: s.resync_s, 30.0),
    Case("reconcile-seconds", "BIAXIAL_RECONCILE_SECONDS", "5", lambda s: s.reconcile_s, 5.0),
    Case(
        "release-grace-seconds",
        "BIAXIAL_RELEASE_GRACE_SECONDS",
        "30",
        lambda s: s.release_grace_s,
        30.0,
    ),
    Case(
        "event-namespace",
        "BIAXIAL_EVENT_NAMESPACE",
        "gpu-system",
        lambda s: s.event_namespace,
        "gpu-system",
    ),
]
COMMANDS = {"controller": (controller_cmd, CONTROLLER), "kubelet-plugin": (plugin_cmd, PLUGIN)}
CASES = [(name, case) for name, (_, cases) in COMMANDS.items() for case in cases]
IDS = [f"{name}:{case.flag}" for name, case in CASES]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No variable of either command is set, except this node's name for the plugin."""
    for command, _ in COMMANDS.values():
        for flag in command.FLAGS:
            for env in (flag.env, *flag.conventional_env):
                monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("NODE_NAME", "n1")
    level = logging.getLogger("biaxial").level
    yield
    logging.getLogger("biaxial").setLevel(level)


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\n")
    return str(path)


def settings(command: ModuleType, *argv: str) -> Any:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.settings_from_args(parser.parse_args(list(argv)))


def argv_for(command: ModuleType, case: Case, text: str) -> list[str]:
    flag = next(f for f in command.FLAGS if f.name == case.flag)
    if flag.kind.switch:
        return [f"--{case.flag}" if flags_module.parse_switch(text) else f"--no-{case.flag}"]
    return [f"--{case.flag}", text]


def test_every_flag_of_both_commands_has_a_case() -> None:
    for command, cases in COMMANDS.values():
        assert [f.name for f in command.FLAGS] == [c.flag for c in cases]
        assert [f.env for f in command.FLAGS] == [c.env for c in cases]


@pytest.mark.parametrize(("name", "case"), CASES, ids=IDS)
def test_each_flag_and_its_environment_twin_set_the_setting(
    name: str, case: Case, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, _ = COMMANDS[name]
    if case.flag == "fake-device-dir":
        monkeypatch.setenv("BIAXIAL_FAKE_GPUS", "t4x4")
    text = kubeconfig if case.text == KUBECONFIG else case.text
    expected: Any = case.expected
    if case.text == KUBECONFIG:
        expected = kubeconfig if name == "controller" else Path(kubeconfig)
    assert case.read(settings(command, *argv_for(command, case, text))) == expected
    monkeypatch.setenv(case.env, text)
    assert case.read(settings(command)) == expected
    # The flag wins: with it given, its twin is not even read (garbage there is fine).
    monkeypatch.setenv(case.env, "#not a value#")
    assert case.read(settings(command, *argv_for(command, case, text))) == expected


@pytest.mark.parametrize(
    ("name", "flag", "conventional"),
    [
        ("controller", "kubeconfig", "KUBECONFIG"),
        ("kubelet-plugin", "kubeconfig", "KUBECONFIG"),
        ("kubelet-plugin", "node-name", "NODE_NAME"),
        ("kubelet-plugin", "pod-uid", "POD_UID"),
        ("kubelet-plugin", "event-namespace", "POD_NAMESPACE"),
    ],
)
def test_the_twin_wins_over_the_conventional_variable_which_wins_over_the_default(
    name: str, flag: str, conventional: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, _ = COMMANDS[name]
    parsed = argparse.Namespace(**{flag.replace("-", "_"): None})
    monkeypatch.setenv(conventional, "from-conventional")
    value = command.FLAGS.read(parsed).value(flag)
    assert (value.text, value.source) == ("from-conventional", conventional)
    monkeypatch.setenv(f"BIAXIAL_{flag.upper().replace('-', '_')}", "from-twin")
    value = command.FLAGS.read(parsed).value(flag)
    assert (value.text, value.source) == ("from-twin", f"BIAXIAL_{flag.upper().replace('-', '_')}")


def test_a_blank_value_counts_as_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIAXIAL_QPS", "  ")
    assert settings(controller_cmd, "--burst", "").burst == 200
    assert settings(controller_cmd).qps == 100.0


def test_the_defaults_shown_in_help_are_the_settings_defaults() -> None:
    ctl = settings(controller_cmd, "--identity", "x")
    assert dataclasses.replace(ctl, identity="x") == dataclasses.replace(
        ControllerSettings(), identity="x"
    )
    assert settings(plugin_cmd) == PluginSettings(node_name="n1")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--qps", "fast"],
            {},
            "--qps: 'fast' is not a number (from the flag; environment twin $BIAXIAL_QPS)",
        ),
        ([], {"BIAXIAL_BURST": "1.5"}, "--burst: '1.5' is not an integer (from $BIAXIAL_BURST)"),
        (
            [],
            {"BIAXIAL_LEADER_ELECT": "maybe"},
            "--leader-elect: 'maybe' is not true or false (from $BIAXIAL_LEADER_ELECT)",
        ),
        (
            [],
            {"BIAXIAL_METRICS_PORT": "70000"},
            "--metrics-port must be in 0..65535, got 70000 (from $BIAXIAL_METRICS_PORT)",
        ),
        (
            [],
            {"BIAXIAL_NODE_POLICY": "pack"},
            (
                "--node-policy: unknown policy 'pack' (allowed: binpack, spread) "
                "(from $BIAXIAL_NODE_POLICY)"
            ),
        ),
        (
            ["--log-format", "xml"],
            {},
            (
                "--log-format: 'xml' is not one of text, json "
                "(from the flag; environment twin $BIAXIAL_LOG_FORMAT)"
            ),
        ),
        (
            [],
            {"KUBECONFIG": "/no/such/file"},
            "--kubeconfig: no such file: /no/such/file (from $KUBECONFIG)",
        ),
        (
            [],
            {"BIAXIAL_DEFAULT_SPREAD_CONSTRAINTS": "zone:0:DoNotSchedule"},
            (
                "--default-spread-constraints: 'zone:0:DoNotSchedule': maxSkew must be an "
                "integer >= 1 (from $BIAXIAL_DEFAULT_SPREAD_CONSTRAINTS)"
            ),
        ),
        (
            ["--decision-timeout", "-1"],
            {},
            (
                "--decision-timeout must be a number of seconds >= 0 (0: none), got -1.0 "
                "(from the flag; environment twin $BIAXIAL_DECISION_TIMEOUT)"
            ),
        ),
    ],
)
def test_controller_bad_values_name_the_flag_and_where_the_value_came_from(
    argv: list[str], env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(InvalidInputError) as info:
        settings(controller_cmd, *argv)
    assert str(info.value) == message


def test_plugin_bad_values_name_the_flag_and_where_the_value_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BIAXIAL_REMOVE_SLICES_ON_EXIT", "nope")  # was silently false before
    with pytest.raises(ConfigError) as info:
        settings(plugin_cmd)
    assert str(info.value) == (
        "--remove-slices-on-exit: 'nope' is not true or false (from $BIAXIAL_REMOVE_SLICES_ON_EXIT)"
    )
    monkeypatch.setenv("BIAXIAL_REMOVE_SLICES_ON_EXIT", "true")
    assert settings(plugin_cmd, "--no-remove-slices-on-exit").remove_slices_on_exit is False
    monkeypatch.delenv("BIAXIAL_REMOVE_SLICES_ON_EXIT")
    monkeypatch.delenv("NODE_NAME")
    with pytest.raises(ConfigError) as info:
        settings(plugin_cmd)
    assert str(info.value) == "--node-name is required (or set NODE_NAME / BIAXIAL_NODE_NAME)"
    with pytest.raises(ConfigError) as info:
        settings(plugin_cmd, "--node-name", "n", "--share-strategies", "mps,timeslice")
    assert str(info.value) == (
        "--share-strategies: 'mps,timeslice' is not a comma-separated list of hami-core, mps, "
        "none (each once) (from the flag; environment twin $BIAXIAL_SHARE_STRATEGIES)"
    )
    with pytest.raises(ConfigError) as info:
        settings(plugin_cmd, "--node-name", "Bad_Node")
    assert str(info.value) == (
        "--node-name 'Bad_Node' is not a valid node name "
        "(from the flag; environment twin $BIAXIAL_NODE_NAME)"
    )


def test_stand_in_device_nodes_need_fake_gpus_and_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        settings(plugin_cmd, "--node-name", "n", "--fake-device-dir", str(tmp_path))
    assert str(info.value).startswith("--fake-device-dir needs --fake-gpus")
    with pytest.raises(ConfigError) as info:
        settings(plugin_cmd, "--node-name", "n", "--fake-gpus", "t4x4",
                 "--fake-device-dir", str(tmp_path / "none"))  # fmt: skip
    assert "must be an existing absolute directory" in str(info.value)
    stand_ins = settings(plugin_cmd, "--node-name", "n", "--fake-gpus", "t4x4",
                         "--fake-device-dir", str(tmp_path))  # fmt: skip
    assert stand_ins.prepare_settings().fake_device_dir == tmp_path


def test_a_policy_error_keeps_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIAXIAL_GPU_POLICY", "pack")
    with pytest.raises(PolicyError, match=r"--gpu-policy: unknown policy 'pack'"):
        settings(controller_cmd)


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (
            ["controller"],
            {"BIAXIAL_QPS": "fast"},
            "biaxial controller: error: --qps: 'fast' is not a number (from $BIAXIAL_QPS)",
        ),
        (
            ["kubelet-plugin", "--resync-seconds", "soon"],
            {},
            (
                "biaxial kubelet-plugin: error: --resync-seconds: 'soon' is not a number "
                "(from the flag; environment twin $BIAXIAL_RESYNC_SECONDS)"
            ),
        ),
    ],
)
def test_the_cli_prints_one_line_and_exits_2(
    argv: list[str],
    env: dict[str, str],
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 2
    assert capsys.readouterr().err == f"{line}\n"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_documents_the_convention_and_every_twin(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        command
    ]
    text = sub.format_help()
    assert "Every flag has an environment twin" in text
    assert "INFO by default" in text
    for flag in COMMANDS[command][0].FLAGS:
        assert flag.env in text


@pytest.mark.parametrize(("verbose", "level"), [(0, logging.INFO), (2, logging.DEBUG)])
def test_a_daemon_logs_its_lifecycle_by_default(verbose: int, level: int) -> None:
    logging.getLogger("biaxial").setLevel(logging.DEBUG if verbose else logging.WARNING)
    flags_module.daemon_logging(verbose)
    assert logging.getLogger("biaxial").level == level


def test_operations_doc_lists_every_flag_with_its_twin() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    rows = [line for line in doc.splitlines() if line.startswith("| `--")]
    for command, _ in COMMANDS.values():
        for flag in command.FLAGS:
            assert any(f"`{flag.option}`" in row and f"`{flag.env}`" in row for row in rows), (
                f"docs/operations.md has no row for {flag.option} / {flag.env}"
            )

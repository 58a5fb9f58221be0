"""Plugin settings: socket paths, validation (one clear line per problem), flags with
environment twins."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import pytest

from biaxial.commands import kubelet_plugin
from driver.api.errors import ConfigError
from kubeletplugin.settings import DEFAULT_HAMI_CORE_LIBRARY, Settings, with_installed_hami_core


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kubelet_plugin.add_arguments(parser)
    return parser.parse_args(argv)


def test_default_socket_paths_are_the_kubelet_conventions() -> None:
    settings = Settings(node_name="n1").validate()
    assert settings.registration_socket == Path(
        "/var/lib/kubelet/plugins_registry/gpu.biaxial.dev-reg.sock"
    )
    assert settings.dra_socket == Path("/var/lib/kubelet/plugins/gpu.biaxial.dev/dra.sock")


def test_pod_uid_gives_per_pod_sockets_hashed_when_too_long() -> None:
    uid = "0f2b6c1e-7d7a-4b8e-9a7c-3f1d2e4b5a69"
    settings = Settings(node_name="n1", pod_uid=uid)
    assert settings.registration_socket.name == f"gpu.biaxial.dev-{uid}-reg.sock"
    assert settings.dra_socket.name == f"dra-{uid}.sock"
    long_driver = Settings(node_name="n1", driver_name="d" * 60, pod_uid=uid)
    name = long_driver.registration_socket.name
    assert name.startswith("d" * 60 + "-")
    assert len(name) == 60 + 1 + 8 + len("-reg.sock")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"node_name": ""}, "--node-name is required"),
        ({"node_name": "Bad_Node"}, "--node-name 'Bad_Node' is not a valid node name"),
        ({"driver_name": "x" * 64}, "must be a DNS subdomain of at most 63"),
        ({"metrics_port": 70000}, "--metrics-port 70000"),
        ({"pod_uid": "a/b"}, "--pod-uid 'a/b' is not a UID"),
        ({"resync_s": 0}, "--resync-seconds must be positive"),
        ({"state_dir": Path("relative")}, "--state-dir relative must be an absolute path"),
        ({"plugin_dir": Path("/tmp/" + "p" * 90)}, "DRA socket path /tmp/ppp"),
        ({"kubeconfig": Path("/nonexistent")}, "--kubeconfig /nonexistent: no such file"),
        ({"fake_gpus": "t5x9"}, "--fake-gpus 't5x9' is neither a built-in profile (a100"),
        (
            {"mps_root": Path("/var/lib/kubelet/plugins/gpu.biaxial.dev/mps")},
            (
                "--mps-root /var/lib/kubelet/plugins/gpu.biaxial.dev/mps must be an absolute "
                "path of at most 38 bytes"
            ),
        ),
        ({"mps_root": Path("mps")}, "--mps-root mps must be an absolute path"),
        ({"max_shares_per_gpu": -1}, "--max-shares-per-gpu must be 0 (no cap) or positive"),
    ],
)
def test_invalid_settings_name_the_flag(overrides: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"node_name": "n1", **overrides}
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings(**fields).validate()  # type: ignore[arg-type]


def test_flags_have_environment_twins_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-node-name")
    monkeypatch.setenv("BIAXIAL_FAKE_GPUS", "t4x4")
    monkeypatch.setenv("BIAXIAL_METRICS_PORT", "9400")
    monkeypatch.setenv("BIAXIAL_REMOVE_SLICES_ON_EXIT", "true")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    settings = kubelet_plugin.settings_from_args(parse([]))
    assert settings.node_name == "from-node-name"
    assert settings.fake_gpus == "t4x4"
    assert settings.metrics_port == 9400
    assert settings.remove_slices_on_exit
    assert not settings.advertise_legacy_resources
    assert settings.kubeconfig is None  # in-cluster

    monkeypatch.setenv("BIAXIAL_NODE_NAME", "from-biaxial")
    assert kubelet_plugin.settings_from_args(parse([])).node_name == "from-biaxial"
    flagged = kubelet_plugin.settings_from_args(
        parse(["--node-name", "flag", "--metrics-port", "0"])
    )
    assert (flagged.node_name, flagged.metrics_port) == ("flag", 0)


def test_bad_numbers_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIAXIAL_RESYNC_SECONDS", "soon")
    message = "--resync-seconds: 'soon' is not a number (from $BIAXIAL_RESYNC_SECONDS)"
    with pytest.raises(ConfigError, match=re.escape(message)):
        kubelet_plugin.settings_from_args(parse(["--node-name", "n1"]))


def test_prepare_settings_carry_the_plugin_settings() -> None:
    settings = Settings(
        node_name="n1",
        driver_name="gpu.example.com",
        state_dir=Path("/s"),
        cdi_dir=Path("/c"),
        hami_core_library_path=Path("/lib/libvgpu.so"),
    )
    prepare = settings.prepare_settings()
    assert prepare.max_shares_per_gpu is None  # 0: no cap
    assert Settings(node_name="n1", max_shares_per_gpu=4).prepare_settings().max_shares_per_gpu == 4
    assert (prepare.node_name, prepare.driver_name) == ("n1", "gpu.example.com")
    assert (prepare.state_dir, prepare.cdi_dir) == (Path("/s"), Path("/c"))
    assert prepare.hami_core_library_path == Path("/lib/libvgpu.so")


def test_hami_core_library_default_none_and_relative(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BIAXIAL_HAMI_CORE_LIBRARY", raising=False)
    default = kubelet_plugin.settings_from_args(parse(["--node-name", "n1"]))
    assert default.hami_core_library_path == DEFAULT_HAMI_CORE_LIBRARY
    off = kubelet_plugin.settings_from_args(
        parse(["--node-name", "n1", "--hami-core-library", "none"])
    )
    assert off.hami_core_library_path is None
    monkeypatch.setenv("BIAXIAL_HAMI_CORE_LIBRARY", "/usr/local/vgpu/libvgpu.so")
    env = kubelet_plugin.settings_from_args(parse(["--node-name", "n1"]))
    assert env.hami_core_library_path == Path("/usr/local/vgpu/libvgpu.so")
    with pytest.raises(ConfigError, match=r"lib/libvgpu\.so must be an absolute"):
        kubelet_plugin.settings_from_args(
            parse(["--node-name", "n1", "--hami-core-library", "lib/libvgpu.so"])
        )


def test_a_missing_hami_core_library_is_dropped_at_start_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    library = tmp_path / "hami-core" / "libvgpu.so"
    settings = Settings(node_name="n1", hami_core_library_path=library)
    with caplog.at_level(logging.INFO, logger="biaxial.kubeletplugin.settings"):
        missing = with_installed_hami_core(settings.prepare_settings())
    assert missing.hami_core_library_path is None
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"HAMi-core library {library} not found" in warning.getMessage()
    caplog.clear()
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF")
    (library.parent / "VERSION").write_text("HAMi-core v2.9.0 (commit 5091a2f)\n")
    with caplog.at_level(logging.INFO, logger="biaxial.kubeletplugin.settings"):
        found = with_installed_hami_core(settings.prepare_settings())
    assert found.hami_core_library_path == library
    assert f"HAMi-core library {library} (HAMi-core v2.9.0 (commit 5091a2f))" in caplog.text
    none = Settings(node_name="n1", hami_core_library_path=None).prepare_settings()
    assert with_installed_hami_core(none) is none


def test_dynamic_mig_is_off_unless_asked_and_takes_all_or_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BIAXIAL_DYNAMIC_MIG", raising=False)
    assert kubelet_plugin.settings_from_args(parse(["--node-name", "n1"])).dynamic_mig.off
    every = kubelet_plugin.settings_from_args(parse(["--node-name", "n1", "--dynamic-mig", "all"]))
    assert every.dynamic_mig.everywhere
    monkeypatch.setenv("BIAXIAL_DYNAMIC_MIG", "NVIDIA A100-SXM4-80GB,NVIDIA H100 80GB HBM3")
    models = kubelet_plugin.settings_from_args(parse(["--node-name", "n1"])).dynamic_mig.models
    assert models == {"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"}
    with pytest.raises(ConfigError, match="--dynamic-mig: 'a,,b' is not off, all"):
        kubelet_plugin.settings_from_args(parse(["--node-name", "n1", "--dynamic-mig", "a,,b"]))

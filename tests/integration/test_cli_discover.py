"""``biaxial discover`` end to end: output formats, strict schema validity for 1.34 and 1.37,
the contract's values, node-name defaults, and one-line errors with non-zero exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.cli import main
from tests.validate_manifests import validate_object, validate_paths

MIB = 1024 * 1024


def discover(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["discover", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_t4_json_is_a_strictly_valid_list_with_the_contract_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = discover(capsys, "--fake", "t4x4", "--node", "gpu-t4", "-o", "json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert document["apiVersion"] == "v1"
    assert document["kind"] == "List"
    (item,) = document["items"]
    for version in ("1.34", "1.37"):
        assert validate_object(item, version) == []
    spec = item["spec"]
    assert item["metadata"]["name"] == "gpu-t4-gpu.biaxial.dev-00"
    assert spec["driver"] == "gpu.biaxial.dev"
    assert spec["nodeName"] == "gpu-t4"
    assert spec["pool"] == {"name": "gpu-t4", "generation": 1, "resourceSliceCount": 1}
    devices = spec["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    uuids = set()
    for i, device in enumerate(devices):
        attrs = device["attributes"]
        uuids.add(attrs["uuid"]["string"])
        assert attrs["type"] == {"string": "gpu"}
        assert attrs["index"] == {"int": i}
        assert attrs["minor"] == {"int": i}
        assert attrs["productName"] == {"string": "Tesla T4"}
        assert attrs["brand"] == {"string": "Nvidia"}
        assert attrs["architecture"] == {"string": "Turing"}
        assert attrs["cudaComputeCapability"] == {"version": "7.5.0"}
        assert attrs["driverVersion"] == {"version": "550.54.15"}
        assert attrs["cudaDriverVersion"] == {"version": "12.4.0"}
        assert attrs["multiprocessors"] == {"int": 40}
        assert attrs["resource.kubernetes.io/pciBusID"] == {"string": f"0000:00:{0x1B + i:02x}.0"}
        assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
        assert attrs["resource.kubernetes.io/numaNode"] == {"int": 0}
        assert attrs["uuid"]["string"].startswith("GPU-")
        assert device["allowMultipleAllocations"] is True
        memory = device["capacity"]["memory"]
        assert memory["value"] == "15Gi"  # 15360 MiB
        assert memory["requestPolicy"] == {
            "default": "15Gi",
            "validRange": {"min": "1Mi", "max": "15Gi", "step": "1Mi"},
        }
        cores = device["capacity"]["cores"]
        assert cores == {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        }
    assert len(uuids) == 4


def test_a10g_values(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = discover(capsys, "--fake", "a10gx4", "--node", "gpu-a10g", "-o", "json")
    assert code == 0
    (item,) = json.loads(out)["items"]
    device = item["spec"]["devices"][0]
    assert device["capacity"]["memory"]["value"] == "23028Mi"
    assert device["attributes"]["productName"] == {"string": "NVIDIA A10G"}
    assert device["attributes"]["driverVersion"] == {"version": "535.104.5"}
    assert device["attributes"]["multiprocessors"] == {"int": 80}


def test_yaml_is_one_document_per_slice_and_equals_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    big = tmp_path / "big.yaml"
    t4 = yaml.safe_load(
        (Path(__file__).parents[2] / "driver/discovery/profiles/t4x4.yaml").read_text(
            encoding="utf-8"
        )
    )
    big.write_text(yaml.safe_dump({**t4, "count": 150}), encoding="utf-8")
    code, out_yaml, _ = discover(capsys, "--fake", str(big), "--node", "big", "-o", "yaml")
    assert code == 0
    documents = list(yaml.safe_load_all(out_yaml))
    code, out_json, _ = discover(capsys, "--fake", str(big), "--node", "big", "-o", "json")
    assert code == 0
    assert documents == json.loads(out_json)["items"]
    assert [len(d["spec"]["devices"]) for d in documents] == [128, 22]
    assert {d["spec"]["pool"]["resourceSliceCount"] for d in documents} == {2}
    path = tmp_path / "out.yaml"
    path.write_text(out_yaml, encoding="utf-8")
    report = validate_paths([str(path)])
    assert (report.checked, report.failures) == (2, [])


def test_output_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    runs = [
        discover(capsys, "--fake", "h100-80gbx8", "--node", "dgx", "-o", "json")[1]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert len(json.loads(runs[0])["items"][0]["spec"]["devices"]) == 16


def test_driver_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = discover(
        capsys, "--fake", "t4x4", "--node", "n", "--driver", "gpu.example.com", "-o", "json"
    )
    assert code == 0
    (item,) = json.loads(out)["items"]
    assert item["spec"]["driver"] == "gpu.example.com"
    assert item["metadata"]["name"] == "n-gpu.example.com-00"


def test_node_defaults_to_node_name_env(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    code, out, _ = discover(capsys, "--fake", "t4x4", "-o", "json")
    assert code == 0
    (item,) = json.loads(out)["items"]
    assert item["spec"]["nodeName"] == "from-env"
    # different nodes, different fake UUIDs
    code, other, _ = discover(capsys, "--fake", "t4x4", "--node", "elsewhere", "-o", "json")
    uuid = item["spec"]["devices"][0]["attributes"]["uuid"]
    assert json.loads(other)["items"][0]["spec"]["devices"][0]["attributes"]["uuid"] != uuid


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_unknown_profile_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = discover(capsys, "--fake", "v100x2", "--node", "n")
    assert code != 0
    assert out == ""
    line = one_line_error(err)
    assert line.startswith("biaxial discover: error: unknown fake GPU profile 'v100x2'")
    assert "t4x4" in line


def test_unreadable_profile_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = discover(capsys, "--fake", str(tmp_path / "nope.yaml"), "--node", "n")
    assert code != 0
    assert "cannot read fake GPU profile" in one_line_error(err)


def test_invalid_profile_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model: {productName: x}\n", encoding="utf-8")
    code, _, err = discover(capsys, "--fake", str(path), "--node", "n")
    assert code != 0
    assert "fake GPU profile 'bad'" in one_line_error(err)


def test_invalid_node_name_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = discover(capsys, "--fake", "t4x4", "--node", "Not_A_Node")
    assert code == 2
    assert "node name 'Not_A_Node'" in one_line_error(err)


def test_no_nvml_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # the library is not installed
    code, out, err = discover(capsys, "--node", "n")
    assert code == 1
    assert out == ""
    line = one_line_error(err)
    assert "NVML is not available on this machine" in line
    assert "--fake PROFILE" in line


def test_console_script_without_gpu_or_with_bad_profile(tmp_path: Path) -> None:
    """The real process: exit codes and stderr as a user sees them (no traceback)."""
    env: dict[str, Any] = {**os.environ, "NODE_NAME": "proc-node"}
    ok = subprocess.run(
        [sys.executable, "-m", "biaxial", "discover", "--fake", "t4x4", "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["items"][0]["spec"]["nodeName"] == "proc-node"
    bad = subprocess.run(
        [sys.executable, "-m", "biaxial", "discover", "--fake", "nope"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2  # an unknown profile is bad input (discover --help)
    assert bad.stdout == ""
    assert one_line_error(bad.stderr).startswith(
        "biaxial discover: error: unknown fake GPU profile"
    )


def test_a_dynamic_mig_profile_publishes_counters_and_placements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = discover(capsys, "--fake", "a100-80gbx8-dynmig", "--node", "dyn", "-o", "json")
    assert (code, err) == (0, "")
    items = json.loads(out)["items"]
    assert [len(i["spec"].get("devices", ())) for i in items] == [64, 64, 64, 16, 0]
    assert [len(i["spec"].get("sharedCounters", ())) for i in items] == [0, 0, 0, 0, 8]
    for item in items:
        for version in ("1.34", "1.37"):
            assert validate_object(item, version) == []


def test_dynamic_mig_needs_mig_mode_and_a_bad_setting_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The A100 profile's GPUs are not in MIG mode: the setting changes nothing.
    code, out, _ = discover(capsys, "--fake", "a100-80gbx8", "--node", "n", "--dynamic-mig", "all")
    assert code == 0
    assert "consumesCounters" not in out
    code, out, err = discover(capsys, "--fake", "t4x4", "--node", "n", "--dynamic-mig", ",")
    assert (code, out) == (2, "")
    assert "--dynamic-mig ','" in one_line_error(err)

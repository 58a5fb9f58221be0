"""``biaxial simulate`` end to end: formats, policy flags, directories, the plot, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.cli import main
from tests.unit.builders import gpu_config
from tests.validate_manifests import validate_object

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = str(ROOT / "examples" / "reference-cluster.yaml")
PATTERNS = ROOT / "examples" / "four-patterns"


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_output_names_every_pod_gpu_and_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = simulate(capsys, INVENTORY, str(PATTERNS / "a-binpack-binpack.yaml"))
    assert (code, err) == (0, "")
    assert out.splitlines()[0].split() == [
        "POD",
        "NODE",
        "GPUS",
        "UUIDS",
        "MEMORY",
        "CORES",
        "POLICIES",
    ]
    rows = [line.split() for line in out.splitlines()[1:5]]
    assert [(r[0], r[1], r[2], r[4], r[6]) for r in rows] == [
        ("default/pattern-a-0", "gpu-t4", "gpu-0", "7500Mi", "binpack/binpack"),
        ("default/pattern-a-1", "gpu-t4", "gpu-0", "7500Mi", "binpack/binpack"),
        ("default/pattern-a-2", "gpu-t4", "gpu-1", "7500Mi", "binpack/binpack"),
        ("default/pattern-a-3", "gpu-t4", "gpu-1", "7500Mi", "binpack/binpack"),
    ]
    assert "placed 4/4 pods on 1 node(s), 2 GPU(s) in use, 6 whole GPU(s) free" in out
    assert "policies: node binpack, GPU binpack (4 pods)" in out
    assert "pods/s" in out


def test_the_summary_names_the_policies_each_pod_got(capsys: pytest.CaptureFixture[str]) -> None:
    # The issue: every summary said "(default policies: node binpack, GPU binpack)".
    code, out, _ = simulate(capsys, INVENTORY, str(PATTERNS / "d-spread-spread.yaml"))
    assert code == 0
    assert "policies: node spread, GPU spread (4 pods)" in out
    assert "binpack" not in out


def test_json_output_shape_and_objects_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = simulate(capsys, INVENTORY, str(PATTERNS / "d-spread-spread.yaml"), "-o", "json")
    assert code == 0
    document = json.loads(out)
    assert set(document) == {
        "placements",
        "unschedulable",
        "skipped",
        "preemptions",
        "notes",
        "admission",
        "summary",
        "objects",
    }
    first = document["placements"][0]
    assert set(first) == {"pod", "node", "policies", "devices"}
    assert first["policies"] == {"node": "spread", "gpu": "spread"}
    assert set(first["devices"][0]) == {"claim", "request", "device", "uuid", "consumedCapacity"}
    assert set(document["summary"]["timing"]) == {
        "startupSeconds",
        "decisionSeconds",
        "podsPerSecond",
        "p99DecisionMs",
    }
    kinds = sorted({o["kind"] for o in document["objects"]})
    assert kinds == ["Pod", "ResourceClaim"]
    for obj in document["objects"]:
        assert validate_object(obj, "1.37") == [], obj["metadata"]["name"]
    claims = [o for o in document["objects"] if o["kind"] == "ResourceClaim"]
    assert all(c["status"]["allocation"] and c["status"]["reservedFor"] for c in claims)


def test_yaml_output_and_policy_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"p{i}", "namespace": "default"},
                    "spec": {
                        "schedulerName": "biaxial",
                        "containers": [
                            {
                                "name": "c",
                                "image": "x",
                                "resources": {"limits": {"nvidia.com/gpu": 1}},
                            }
                        ],
                    },
                }
                for i in range(2)
            ]
        ),
        encoding="utf-8",
    )
    code, out, _ = simulate(
        capsys,
        INVENTORY,
        str(pods),
        "-o",
        "yaml",
        "--node-policy",
        "spread",
        "--gpu-policy",
        "spread",
    )
    assert code == 0
    document: dict[str, Any] = yaml.safe_load(out)
    assert {p["node"] for p in document["placements"]} == {"gpu-t4", "gpu-a10g"}
    assert document["summary"]["policies"] == {
        "defaults": {"node": "spread", "gpu": "spread"},
        "used": {"node spread, GPU spread": 2},
    }


def test_directories_are_read_in_name_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "00-cluster.yaml").write_text(
        Path(INVENTORY).read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "10-app.yaml").write_text(
        (PATTERNS / "c-binpack-spread.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "notes.txt").write_text("not a manifest", encoding="utf-8")
    code, out, _ = simulate(capsys, str(tmp_path), "-o", "json")
    assert code == 0
    placements = json.loads(out)["placements"]
    assert [p["devices"][0]["device"] for p in placements] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_a_directory_without_manifests_is_said_to_give_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Before: beside an inventory, an empty directory was skipped without a word (placed 0/0).
    (tmp_path / "notes.txt").write_text("not a manifest", encoding="utf-8")
    code, out, err = simulate(capsys, INVENTORY, str(tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        f"biaxial simulate: error: {tmp_path}: a directory without .yaml, .yml, .json files; "
        "nothing was read from it\n"
    )


def test_plot_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "b.png"
    code, _, _ = simulate(
        capsys, INVENTORY, str(PATTERNS / "b-spread-binpack.yaml"), "--plot", str(target)
    )
    assert code == 0
    assert target.read_bytes()[:4] == b"\x89PNG"


def test_bad_pods_are_listed_with_reasons(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "bad",
                    "annotations": {"hami.io/gpu-scheduler-policy": "densest"},
                },
                "spec": {
                    "schedulerName": "biaxial",
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                    ],
                },
            }
        ),
        encoding="utf-8",
    )
    code, out, _ = simulate(capsys, INVENTORY, str(PATTERNS / "a-binpack-binpack.yaml"), str(bad))
    assert code == 0
    assert "UNSCHEDULABLE" in out
    assert "default/bad" in out
    assert "annotation hami.io/gpu-scheduler-policy: unknown policy 'densest'" in out
    assert "placed 4/5 pods" in out


def test_a_claim_with_a_gpu_config_the_node_would_refuse_is_unschedulable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifests = tmp_path / "bad-config.yaml"
    manifests.write_text(
        yaml.safe_dump_all(
            [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "bogus", "namespace": "default"},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {
                                        "name": "gpu",
                                        "exactly": {"deviceClassName": "gpu.biaxial.dev"},
                                    }
                                ],
                                "config": [gpu_config("bogus")],
                            }
                        }
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "bogus", "namespace": "default"},
                    "spec": {
                        "schedulerName": "biaxial",
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "bogus"}],
                        "containers": [
                            {"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
                        ],
                    },
                },
            ]
        ),
        encoding="utf-8",
    )
    code, out, err = simulate(capsys, INVENTORY, str(manifests), "-o", "json")
    assert (code, err) == (0, "")
    document = json.loads(out)
    assert document["placements"] == []
    (entry,) = document["unschedulable"]
    assert entry["pod"] == "default/bogus"
    assert (
        "spec.devices.config[0] opaque.parameters: sharing.strategy: unknown value"
        in (entry["reason"])
    )
    claims = [o for o in document["objects"] if o["kind"] == "ResourceClaim"]
    assert not any((c.get("status") or {}).get("allocation") for c in claims)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: [unclosed", "malformed YAML/JSON"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n",
            "no nodes: give a Cluster inventory",
        ),
        ("", "no objects in"),
        ("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n", "no nodes"),
    ],
)
def test_malformed_input_is_one_line_exit_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(content, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "biaxial", "simulate", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("biaxial simulate: error: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_exit_code_1_only_when_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    typo = str(ROOT / "examples" / "requesting-gpus" / "policy-typo.yaml")
    code, out, _ = simulate(capsys, INVENTORY, typo)
    assert code == 0
    assert "UNSCHEDULABLE" in out
    code, _, _ = simulate(capsys, INVENTORY, typo, "--fail-on-unschedulable")
    assert code == 1
    code, _, _ = simulate(
        capsys, INVENTORY, str(PATTERNS / "a-binpack-binpack.yaml"), "--fail-on-unschedulable"
    )
    assert code == 0


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out
    assert "1  some pod is unschedulable (only with --fail-on-unschedulable)" in out
    assert "2  bad input" in out

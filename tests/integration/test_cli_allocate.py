"""``biaxial allocate`` end to end: verdicts, exact allocation objects, policies, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.cli import main
from tests.unit.builders import claim, gpu, node, slice_
from tests.validate_manifests import validate_object

ROOT = Path(__file__).resolve().parents[2]
CLASS = str(ROOT / "deviceclasses" / "gpu.biaxial.dev.yaml")


def write(tmp_path: Path, name: str, *objects: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(list(objects)), encoding="utf-8")
    return str(path)


def allocate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["allocate", *args])
    out, err = capsys.readouterr()
    assert err == ""
    result: dict[str, Any] = json.loads(out)
    return code, result


def cluster(tmp_path: Path) -> str:
    devices = [gpu(i, shared=True, memory="16Gi") for i in range(2)]
    return write(tmp_path, "cluster.yaml", node("node-0"), slice_("node-0-slice", devices=devices))


def test_allocated_claims_are_exact_status_allocations(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    claims = write(
        tmp_path,
        "claims.yaml",
        claim("a", uid="ua")
        .request("gpu", cls="gpu.biaxial.dev", capacity={"memory": "4Gi"})
        .json(),
        claim("b", uid="ub")
        .request("gpu", cls="gpu.biaxial.dev", capacity={"memory": "4Gi"})
        .json(),
    )
    code, result = allocate(capsys, cluster(tmp_path), CLASS, claims)
    assert code == 0
    assert result["node"] == "node-0"
    assert result["outcome"] == "allocated"
    assert list(result["claims"]) == ["default/a", "default/b"]
    first = result["claims"]["default/a"]
    # binpack (the default) puts both 4Gi shares on the same GPU
    assert [r["device"] for r in first["devices"]["results"]] == ["gpu-0"]
    assert [r["device"] for r in result["claims"]["default/b"]["devices"]["results"]] == ["gpu-0"]
    assert first["devices"]["results"][0]["consumedCapacity"] == {"cores": "0", "memory": "4Gi"}
    assert first["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}
        ]
    }
    status = {"allocation": first}
    raw = (
        claim("a", uid="ua")
        .request("gpu", cls="gpu.biaxial.dev", capacity={"memory": "4Gi"})
        .json()
    )
    raw["status"] = status
    assert validate_object(raw, "1.37") == []


def test_spread_and_existing_allocations(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    held = claim("held", uid="uh").allocated(
        {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.biaxial.dev",
                        "pool": "node-0",
                        "device": "gpu-1",
                        "shareID": "0b5f2c62-3c4e-4bb8-8d3e-2f8d1f6c3a10",
                        "consumedCapacity": {"memory": "2Gi", "cores": "0"},
                    }
                ]
            }
        }
    )
    claims = write(
        tmp_path,
        "claims.yaml",
        held.request("gpu", cls="gpu.biaxial.dev").json(),
        claim("new", uid="un")
        .request("gpu", cls="gpu.biaxial.dev", capacity={"memory": "1Gi"})
        .json(),
    )
    _, binpack = allocate(capsys, cluster(tmp_path), CLASS, claims)
    assert binpack["claims"]["default/new"]["devices"]["results"][0]["device"] == "gpu-1"
    _, spread = allocate(capsys, cluster(tmp_path), CLASS, claims, "--gpu-policy", "spread")
    assert spread["claims"]["default/new"]["devices"]["results"][0]["device"] == "gpu-0"
    _, first_fit = allocate(capsys, cluster(tmp_path), CLASS, claims, "--gpu-policy", "first-fit")
    assert first_fit["claims"]["default/new"]["devices"]["results"][0]["device"] == "gpu-0"


def test_unschedulable_and_error_verdicts_exit_0(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    too_big = write(
        tmp_path,
        "big.yaml",
        claim("big", uid="u").request("gpu", cls="gpu.biaxial.dev", count=3).json(),
    )
    code, result = allocate(capsys, cluster(tmp_path), CLASS, too_big)
    assert code == 0
    assert result["outcome"] == "unschedulable"
    assert result["claims"] == {}
    assert "cannot allocate all claims on node node-0" in result["message"]
    unknown = write(
        tmp_path,
        "unknown.yaml",
        claim("x", uid="u").request("gpu", cls="nope.example.com").json(),
    )
    code, result = allocate(capsys, cluster(tmp_path), CLASS, unknown)
    assert code == 0
    assert result["outcome"] == "error"
    assert "could not retrieve device class nope.example.com" in result["message"]


def test_node_selection(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    devices = [gpu(0, shared=True)]
    two = write(
        tmp_path,
        "two.yaml",
        node("node-0"),
        node("node-1"),
        slice_("s0", node="node-0", devices=devices),
        slice_("s1", node="node-1", devices=devices),
        claim("c", uid="u").request("gpu", cls="gpu.biaxial.dev").json(),
    )
    code, result = allocate(capsys, two, CLASS, "--node", "node-1")
    assert code == 0
    assert result["claims"]["default/c"]["devices"]["results"][0]["pool"] == "node-1"


def test_invalid_pool_is_unschedulable_with_upstreams_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Upstream (allocator_incubating.go): no solution + an invalid pool -> the node fails with
    # "invalid resource pools were encountered" (ErrFailedAllocationOnNode), not a fatal error.
    broken = write(
        tmp_path,
        "broken.yaml",
        node("node-0"),
        slice_("s0", node="node-0", devices=[gpu(0), gpu(0)]),
        claim("c", uid="u").request("gpu", cls="gpu.biaxial.dev").json(),
    )
    code, result = allocate(capsys, broken, CLASS)
    assert code == 0
    assert result["outcome"] == "unschedulable"
    assert "node node-0: invalid resource pools were encountered" in result["message"]
    assert "gpu.biaxial.dev/node-0" in result["message"]


@pytest.mark.parametrize(
    ("objects", "args", "message"),
    [
        ([node("a"), node("b")], [], "exactly one Node, or use --node NAME (found 2)"),
        ([node("a")], ["--node", "zz"], "--node zz: no such Node in the input (have: a)"),
        (
            [node("a"), {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}],
            [],
            "unsupported kind 'Secret'",
        ),
        (
            [
                node("a"),
                {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {}},
            ],
            [],
            "metadata.name is required",
        ),
    ],
)
def test_malformed_input_is_one_line_exit_2(
    tmp_path: Path, objects: list[dict[str, Any]], args: list[str], message: str
) -> None:
    path = write(tmp_path, "in.yaml", *objects)
    result = subprocess.run(
        [sys.executable, "-m", "biaxial", "allocate", path, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_the_shipped_classes_are_loaded_as_simulate_loads_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Before: without a DeviceClass file the verdict was "error": "could not retrieve device
    # class gpu.biaxial.dev".
    claims = write(
        tmp_path, "claims.yaml", claim("a", uid="ua").request("gpu", cls="gpu.biaxial.dev").json()
    )
    code, result = allocate(capsys, cluster(tmp_path), claims)
    assert (code, result["outcome"]) == (0, "allocated")
    code, result = allocate(capsys, cluster(tmp_path), claims, "--no-default-classes")
    assert (code, result["outcome"]) == (0, "error")
    assert "could not retrieve device class gpu.biaxial.dev" in result["message"]

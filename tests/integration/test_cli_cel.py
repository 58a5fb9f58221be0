"""``biaxial cel`` end to end on real files (YAML, JSON, multi-document, List), its exit codes
and one-line errors, and ``biaxial.simulate.manifests.load_objects`` on the same inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.cli import main
from biaxial.simulate.manifests import load_objects, objects_of_kind
from driver.api.errors import ManifestError

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.biaxial.dev"
GPU = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'


def _slice(pool: str, *devices: dict[str, Any], driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-{driver}-00"},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "nodeName": pool,
            "devices": list(devices),
        },
    }


def _gpu(name: str, kind: str = "gpu", memory: str = "15Gi") -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            "type": {"string": kind},
            "productName": {"string": "Tesla T4"},
            "cudaComputeCapability": {"version": "7.5.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": memory}},
    }


NODE_A = _slice("node-a", _gpu("gpu-0"), _gpu("gpu-1", memory="40Gi"))
NODE_B = _slice("node-b", _gpu("gpu-0-mig-1g5gb-0", kind="mig", memory="4864Mi"))
NIC = _slice("node-a", {"name": "nic-0", "attributes": {"model": {"string": "cx7"}}},
             driver="nic.example.com")  # fmt: skip
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = main(["cel", *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    multi = tmp_path / "multi.yaml"
    multi.write_text(yaml.safe_dump_all([NODE_A, None, CONFIGMAP]), encoding="utf-8")
    listed = tmp_path / "list.json"
    listed.write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [NODE_B, NIC]}), encoding="utf-8"
    )
    single = tmp_path / "single.yaml"
    single.write_text(yaml.safe_dump(NODE_B), encoding="utf-8")
    return {"multi": multi, "list": listed, "single": single}


def test_results_for_every_device_in_file_order(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path]
) -> None:
    code, report, err = run(capsys, "--expression", GPU, str(files["multi"]), str(files["list"]))
    assert (code, err) == (0, "")
    assert report == {
        "expression": GPU,
        "compileError": None,
        "results": [
            {"pool": "node-a", "device": "gpu-0", "result": True},
            {"pool": "node-a", "device": "gpu-1", "result": True},
            {"pool": "node-b", "device": "gpu-0-mig-1g5gb-0", "result": False},
            {"pool": "node-a", "device": "nic-0", "result": False},
        ],
    }


def test_capacity_selector(capsys: pytest.CaptureFixture[str], files: dict[str, Path]) -> None:
    expression = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("16Gi")) >= 0'
    code, report, _ = run(capsys, "-e", expression, str(files["multi"]))
    assert code == 0
    assert [r["result"] for r in report["results"]] == [False, True]


def test_runtime_errors_are_per_device(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path]
) -> None:
    # No driver check: the NIC's driver domain lacks `type`, the GPUs evaluate normally.
    expression = f'device.attributes["{DRIVER}"].type == "gpu"'
    code, report, _ = run(capsys, "-e", expression, str(files["list"]))
    assert code == 0
    mig, nic = report["results"]
    assert mig == {"pool": "node-b", "device": "gpu-0-mig-1g5gb-0", "result": False}
    assert set(nic) == {"pool", "device", "error"}
    assert "no such key" in nic["error"]
    assert "nic-0" in nic["error"]


def test_compile_error_exits_1_with_json(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path]
) -> None:
    code, report, err = run(capsys, "-e", "device.driver ==", str(files["single"]))
    assert code == 1
    assert err == ""
    assert report["results"] == []
    assert report["expression"] == "device.driver =="
    assert "<input>:1:17: Syntax error" in report["compileError"]


def test_non_bool_expression_is_a_compile_error(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path]
) -> None:
    code, report, _ = run(capsys, "-e", "device.driver", str(files["single"]))
    assert code == 1
    assert "must evaluate to bool" in report["compileError"]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("kind: [unclosed\n", "malformed YAML/JSON at line"),
        ('{"kind": "ResourceSlice", ', "malformed YAML/JSON"),
        ("- just\n- a list\n", "expected a Kubernetes object, got list"),
        ("apiVersion: v1\nmetadata: {}\n", "object without a kind"),
        ("kind: ResourceSlice\n", "ResourceSlice without an apiVersion"),
        ("apiVersion: v1\nkind: List\nitems: 3\n", "List.items must be a list"),
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\n",
            "ResourceSlice 's': missing spec",
        ),
        ("\xff\xfe", "not UTF-8"),
    ],
)
def test_malformed_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, fragment: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content.encode("latin-1"))
    code, report, err = run(capsys, "-e", "true", str(path))
    assert code == 2
    assert report is None
    assert err.count("\n") == 1
    assert err.startswith(f"biaxial cel: error: {path}")
    assert fragment in err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "-e", "true", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert err == f"biaxial cel: error: {tmp_path / 'nope.yaml'}: no such file\n"


def test_no_slices_is_one_line_naming_where_slices_come_from(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Before: exit 0 and {"results": []}, which reads as "no device matches".
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(CONFIGMAP), encoding="utf-8")
    code, report, err = run(capsys, "-e", "true", str(path))
    assert (code, report) == (2, None)
    assert err == (
        f"biaxial cel: error: no ResourceSlice was read from {path}; 'biaxial discover --fake "
        "PROFILE' prints the slices a node with that profile publishes, 'kubectl get "
        "resourceslices -o yaml' a cluster's\n"
    )
    inventory = str(ROOT / "examples" / "reference-cluster.yaml")
    code, report, err = run(capsys, "-e", "true", inventory)
    assert (code, report) == (2, None)
    assert f"from {inventory} (a Cluster inventory holds GPU profiles, not slices); " in err


def test_load_objects_flattens_lists_and_skips_empty_documents(files: dict[str, Path]) -> None:
    objects = load_objects([str(files["multi"]), str(files["list"]), str(files["single"])])
    assert [o["kind"] for o in objects] == [
        "ResourceSlice",
        "ConfigMap",
        "ResourceSlice",
        "ResourceSlice",
        "ResourceSlice",
    ]
    assert len(objects_of_kind(objects, "ResourceSlice", "resource.k8s.io")) == 4
    assert objects_of_kind(objects, "ConfigMap", "") == [CONFIGMAP]
    assert objects_of_kind(objects, "ConfigMap", "apps") == []


def test_load_objects_reads_an_api_list_response(tmp_path: Path) -> None:
    bare = {k: v for k, v in NODE_B.items() if k not in ("apiVersion", "kind")}
    path = tmp_path / "list.json"
    response = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "items": [bare]}
    path.write_text(json.dumps(response), encoding="utf-8")
    assert load_objects([str(path)]) == [NODE_B]


def test_load_objects_names_the_document(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(CONFIGMAP) + "---\n42\n", encoding="utf-8")
    with pytest.raises(ManifestError, match=r"two\.yaml document 2: expected a Kubernetes object"):
        load_objects([str(path)])


def test_subprocess_console_script_reads_files_and_stdin(files: dict[str, Path]) -> None:
    script = Path(sys.executable).with_name("biaxial")
    proc = subprocess.run(
        [str(script), "cel", "--expression", GPU, str(files["single"]), "-"],
        input=yaml.safe_dump(NODE_A),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    report = json.loads(proc.stdout)
    assert report["results"] == [
        {"pool": "node-b", "device": "gpu-0-mig-1g5gb-0", "result": False},
        {"pool": "node-a", "device": "gpu-0", "result": True},
        {"pool": "node-a", "device": "gpu-1", "result": True},
    ]


BOMBS = [
    # issue 15: cel.bind / map / join, each level ten times longer
    "cel.bind(v0, ['"
    + "x" * 64
    + "'], "
    + "".join(
        f"cel.bind(v{i}, v{i - 1}.map(s, [s, s, s, s, s, s, s, s, s, s].join('')), "
        for i in range(1, 9)
    )
    + "v8[0].size() > 0"
    + ")" * 9,
    # string doubling
    "cel.bind(s0, 'xxxxxxxxxxxxxxxx', "
    + "".join(f"cel.bind(s{i}, s{i - 1} + s{i - 1}, " for i in range(1, 29))
    + "s28.size() > 0"
    + ")" * 29,
    "lists.range(1000000000).size() > 0",
    # past upstream's parser limit of 250
    "(" * 250 + "true" + ")" * 250,
]


@pytest.mark.parametrize("expression", BOMBS)
def test_bombs_are_errors_not_tracebacks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, expression: str
) -> None:
    path = tmp_path / "slices.yaml"
    path.write_text(yaml.safe_dump(NODE_A))
    code, out, err = run(capsys, "-e", expression, str(path))
    assert "Traceback" not in err
    assert code in (0, 1)
    if code == 0:
        assert all("error" in r for r in out["results"]), out
        assert all("cost limit exceeded" in r["error"] for r in out["results"])
    else:
        assert out["compileError"]


def test_nesting_within_upstreams_parser_limit_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # cel-cpp parses 32 levels; upstream 250, and so does biaxial (driver.cel.deep).
    path = tmp_path / "slices.yaml"
    path.write_text(yaml.safe_dump(NODE_A))
    code, out, err = run(capsys, "-e", "(" * 40 + "true" + ")" * 40, str(path))
    assert "Traceback" not in err
    assert code == 0
    assert out["results"], out
    assert all(r["result"] is True for r in out["results"]), out


def test_many_iterations_within_the_cost_limit_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 11,110 comprehension iterations, more than cel-cpp's budget of 10,000 per evaluation:
    # upstream bounds only the cost (45,551 here) and evaluates it to true; so does biaxial,
    # driving the comprehensions from Python (driver.cel.drive).
    path = tmp_path / "slices.yaml"
    path.write_text(yaml.safe_dump(NODE_A))
    ten = "[0,1,2,3,4,5,6,7,8,9]"
    expression = f"{ten}.all(a, {ten}.all(b, {ten}.all(c, {ten}.all(d, true))))"
    code, out, err = run(capsys, "-e", expression, str(path))
    assert "Traceback" not in err
    assert code == 0
    assert out["results"], out
    assert all(r["result"] is True for r in out["results"]), out

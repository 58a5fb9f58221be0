"""``biaxial simulate --admission``: the migration guide's unchanged manifests (device plugin,
HAMi, Volcano, KAI) place as their edited "after" versions do, and the output says what the
chart's admission step changed on each pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.cli import main
from biaxial.simulate.admission import DEFAULT_VALUES

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = str(ROOT / "examples" / "reference-cluster.yaml")
MIGRATION = ROOT / "examples" / "migration"
CHART_VALUES = ROOT / "deploy" / "helm" / "biaxial" / "values.yaml"


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["simulate", "-o", "json", *args])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    return dict(json.loads(out))


def _where(result: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    return [
        (p["pod"], p["node"], [d["device"] for d in p["devices"]]) for p in result["placements"]
    ]


@pytest.mark.parametrize(
    ("source", "changed"),
    [
        ("device-plugin", "schedulerName: default-scheduler -> biaxial"),
        ("hami", "schedulerName: default-scheduler -> biaxial"),
        ("volcano", "schedulerName: volcano -> biaxial"),
        (
            "kai",
            "schedulerName: kai-scheduler -> biaxial; containers[0] (jupyter) nvidia.com/gpu: 1",
        ),
    ],
)
def test_unchanged_manifests_place_as_the_edited_ones(
    capsys: pytest.CaptureFixture[str], source: str, changed: str
) -> None:
    before = str(MIGRATION / f"{source}-before.yaml")
    unchanged = simulate(capsys, INVENTORY, before)
    assert unchanged["placements"] == []
    assert unchanged["admission"] == []
    admitted = simulate(capsys, INVENTORY, before, "--admission")
    edited = simulate(capsys, INVENTORY, str(MIGRATION / f"{source}-after.yaml"))
    if source == "device-plugin":
        assert [(p, len(d)) for p, _, d in _where(admitted)] == [
            (p, len(d)) for p, _, d in _where(edited)
        ]
    else:
        assert _where(admitted) == _where(edited) != []
    assert {a["changed"] for a in admitted["admission"]} == {changed}
    assert [a["pod"] for a in admitted["admission"]] == [p[0] for p in _where(admitted)]


def test_the_table_says_what_admission_changed(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", INVENTORY, str(MIGRATION / "volcano-before.yaml"), "--admission"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "ADMISSION CHANGED" in out
    assert "default/vgpu-trainer  schedulerName: volcano -> biaxial" in out


def test_values_scope_it_as_the_chart_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"admission": {"enabled": True}}))
    before = str(MIGRATION / "volcano-before.yaml")
    outside = simulate(capsys, INVENTORY, before, "--admission-values", str(values))
    assert outside["admission"] == []
    assert outside["placements"] == []
    namespace = tmp_path / "namespace.yaml"
    namespace.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": "default", "labels": {"biaxial.dev/admission": "enabled"}},
            }
        )
    )
    inside = simulate(capsys, INVENTORY, str(namespace), before, "--admission-values", str(values))
    assert [a["pod"] for a in inside["admission"]] == ["default/vgpu-trainer"]
    values.write_text(yaml.safe_dump({"admission": {"schedulers": ["default-scheduler"]}}))
    narrow = simulate(capsys, INVENTORY, str(namespace), before, "--admission-values", str(values))
    assert narrow["admission"] == []


def test_the_defaults_are_the_charts() -> None:
    chart = yaml.safe_load(CHART_VALUES.read_text())["admission"]
    assert {k: chart[k] for k in DEFAULT_VALUES} == DEFAULT_VALUES
    assert chart["enabled"] is False

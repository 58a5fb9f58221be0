"""The strict manifest validator (``python -m tests.validate_manifests``): what passes, what
fails and how it is reported, biaxial's own kinds, Lists, recursion, and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.validate_manifests import main, validate_object, validate_paths

DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "example"},
    "spec": {"selectors": [{"cel": {"expression": "true"}}]},
}


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_valid_object_has_no_errors(version: str) -> None:
    assert validate_object(DEVICE_CLASS, version) == []


def test_unknown_field_is_an_error_in_strict_mode() -> None:
    bad = {**DEVICE_CLASS, "spec": {**DEVICE_CLASS["spec"], "colour": "green"}}  # type: ignore[dict-item]
    (error,) = validate_object(bad, "1.37")
    assert error.startswith("DeviceClass/example: v1.37: spec: Additional properties")
    assert "'colour' was unexpected" in error


def test_wrong_type_names_the_path() -> None:
    bad = {**DEVICE_CLASS, "spec": {"selectors": [{"cel": {"expression": 7}}]}}
    (error,) = validate_object(bad, "1.34")
    assert "spec.selectors.0.cel.expression" in error


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
            "no schema for example.com/v1 Widget",
        ),
        (
            {"apiVersion": "resource.example.com/v1", "kind": "DeviceClass"},
            "no schema for resource.example.com/v1",
        ),
        ({"kind": "DeviceClass"}, "apiVersion and kind must be strings"),
        ([1, 2], "document is a list"),
    ],
)
def test_objects_without_a_schema_fail(obj: object, message: str) -> None:
    (error,) = validate_object(obj, "1.37")
    assert message in error


def test_paths_recursion_lists_and_own_kinds(tmp_path: Path) -> None:
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    (nested / "classes.yaml").write_text(
        yaml.safe_dump_all(
            [
                DEVICE_CLASS,
                {"apiVersion": "biaxial.dev/v1alpha1", "kind": "Cluster", "nodes": []},
                {"apiVersion": "gpu.biaxial.dev/v1alpha1", "kind": "GpuConfig", "sharing": "mps"},
            ]
        ),
        encoding="utf-8",
    )
    (tmp_path / "list.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [DEVICE_CLASS, DEVICE_CLASS]}),
        encoding="utf-8",
    )
    (tmp_path / "notes.txt").write_text("not a manifest", encoding="utf-8")
    report = validate_paths([str(tmp_path)])
    assert (report.checked, report.skipped_own, report.failures) == (3, 2, [])


def test_unparseable_file_is_a_failure(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("a: [b\n", encoding="utf-8")
    report = validate_paths([str(path)])
    assert len(report.failures) == 1
    assert report.failures[0].startswith(f"{path}: not valid YAML/JSON")


def test_main_exit_codes_and_one_line_per_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(DEVICE_CLASS), encoding="utf-8")
    assert main([str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**DEVICE_CLASS, "extra": 1}), encoding="utf-8")
    capsys.readouterr()
    assert main([str(good), str(bad)]) == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 2  # one per version (1.34 and 1.37)
    assert all(line.startswith(f"{bad}: DeviceClass/example: v1.3") for line in lines)
    assert "1 failure" not in err
    assert "2 failure(s)" in err
    assert main([str(good), "--version", "1.99"]) == 2
    assert main([str(tmp_path / "missing")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2


def test_repository_device_classes_are_valid() -> None:
    root = Path(__file__).parents[2]
    assert main([str(root / "deviceclasses")]) == 0

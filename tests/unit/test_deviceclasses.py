"""The shipped DeviceClasses: strictly schema-valid, every selector checks ``device.driver``
first, compiles with the project's CEL engine and selects exactly the intended fake devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import Device
from driver.cel.engine import compile_selector
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from tests.validate_manifests import validate_object

CLASSES_DIR = Path(__file__).parents[2] / "deviceclasses"
CLASS_FILES = sorted(CLASSES_DIR.glob("*.yaml"))


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((CLASSES_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def selectors(device_class: dict[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]


def devices(profile: str, driver_name: str = DEFAULT_DRIVER_NAME) -> list[Device]:
    gpus = open_backend(profile, node_name="n").discover()
    return [
        d for s in build_slices(gpus, node_name="n", driver_name=driver_name) for d in s.devices
    ]


def selected(
    class_name: str, candidates: list[Device], driver_name: str = DEFAULT_DRIVER_NAME
) -> list[str]:
    compiled = [compile_selector(e) for e in selectors(load(class_name))]
    return [d.name for d in candidates if all(c.matches(d, driver_name) for c in compiled)]


def test_the_contract_classes_exist() -> None:
    names = {p.name.removesuffix(".yaml") for p in CLASS_FILES}
    assert {"gpu.biaxial.dev", "mig.biaxial.dev"} <= names
    assert len(names) >= 3  # plus at least one product-specific example


@pytest.mark.parametrize("path", CLASS_FILES, ids=lambda p: p.name)
def test_class_file_is_one_strictly_valid_device_class_named_like_its_file(path: Path) -> None:
    (document,) = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    assert document["kind"] == "DeviceClass"
    assert document["apiVersion"] == "resource.k8s.io/v1"
    assert document["metadata"]["name"] == path.name.removesuffix(".yaml")
    for version in ("1.34", "1.37"):
        assert validate_object(document, version) == []


@pytest.mark.parametrize("path", CLASS_FILES, ids=lambda p: p.name)
def test_every_selector_checks_the_driver_first_and_compiles(path: Path) -> None:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    expressions = selectors(document)
    assert expressions
    for expression in expressions:
        assert expression.startswith(f'device.driver == "{DEFAULT_DRIVER_NAME}" &&'), expression
        compile_selector(expression)


def test_gpu_class_maps_the_legacy_resource_name() -> None:
    assert load("gpu.biaxial.dev")["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_gpu_class_selects_whole_gpus_only() -> None:
    assert selected("gpu.biaxial.dev", devices("t4x4")) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert selected("gpu.biaxial.dev", devices("h100-80gbx8")) == [f"gpu-{i}" for i in range(6)]


def test_mig_class_selects_mig_partitions_only() -> None:
    assert selected("mig.biaxial.dev", devices("t4x4")) == []
    chosen = selected("mig.biaxial.dev", devices("h100-80gbx8"))
    assert len(chosen) == 10
    assert all("-mig-" in name for name in chosen)


def test_product_class_selects_its_product_only() -> None:
    assert selected("a100-80gb.gpu.biaxial.dev", devices("a100-80gbx8")) == [
        f"gpu-{i}" for i in range(8)
    ]
    for other in ("t4x4", "a10gx4", "a100-40gbx8", "h100-80gbx8"):
        assert selected("a100-80gb.gpu.biaxial.dev", devices(other)) == []


@pytest.mark.parametrize("path", CLASS_FILES, ids=lambda p: p.name)
def test_selectors_do_not_error_on_another_drivers_devices(path: Path) -> None:
    """A device of another driver has no attributes in our domain: the driver check must
    short-circuit (a runtime error here would block every pod that uses the class)."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    foreign = [Device(name="dev-0", attributes={"model": "other"})]
    for expression in selectors(document):
        assert compile_selector(expression).matches(foreign[0], "other.example.com") is False

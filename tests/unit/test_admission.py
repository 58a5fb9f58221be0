"""The admission mutation as a pure function, driven by the table in tests/admission_cases.py
(the same table drives the chart's policy on the real API server)."""

from __future__ import annotations

import copy
import re

import pytest

from driver.api.labels import LabelSelector
from driver.scheduling.admission import GPU_ANNOTATIONS, GPU_RESOURCES, AdmissionScope, admit
from tests.admission_cases import (
    CASES,
    IN_SCOPE,
    OUT_OF_SCOPE,
    SCHEDULERS,
    VALUES,
    Case,
    expected,
    observed,
)
from tests.render_chart import render_objects
from tests.validate_manifests import validate_object

SCOPE = AdmissionScope(
    namespaces=LabelSelector.from_api(VALUES["admission"]["namespaceSelector"], "test"),
    schedulers=frozenset(SCHEDULERS),
)


def _admitted(case: Case, labels: dict[str, str]) -> dict:
    before = copy.deepcopy(case.pod)
    change = admit(case.pod, labels, SCOPE)
    assert case.pod == before, "admit never mutates its input"
    return change.apply(case.pod) if change is not None else case.pod


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_in_scope(case: Case) -> None:
    assert observed(_admitted(case, IN_SCOPE)) == expected(case, in_scope=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_out_of_scope_is_untouched(case: Case) -> None:
    assert _admitted(case, OUT_OF_SCOPE) == case.pod


def test_only_the_listed_schedulers_are_taken() -> None:
    hami = next(c for c in CASES if c.name == "hami-named")
    narrow = AdmissionScope(SCOPE.namespaces, frozenset({"default-scheduler"}))
    assert admit(hami.pod, IN_SCOPE, narrow) is None


def test_apply_touches_only_the_scheduler_the_container_and_the_note() -> None:
    kai = next(c for c in CASES if c.name == "kai-on-biaxial")
    change = admit(kai.pod, IN_SCOPE, SCOPE)
    assert change is not None
    after = change.apply(kai.pod)
    assert after["metadata"]["annotations"] == {
        **kai.pod["metadata"]["annotations"],
        "biaxial.dev/admission": "containers[0] (main) nvidia.com/gpu: 1",
    }
    assert after["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "1"},
        "requests": {"nvidia.com/gpu": "1"},
    }
    after["metadata"]["annotations"] = kai.pod["metadata"]["annotations"]
    del after["spec"]["containers"][0]["resources"]
    assert after == kai.pod


def test_the_chart_policy_knows_the_same_names() -> None:
    """The policy's lists of GPU resource names and annotations are the module's (the table
    holds the rest of the two to each other on the real API server)."""
    policy = next(r.obj for r in render_objects(VALUES) if r.kind == "MutatingAdmissionPolicy")
    asks = next(v for v in policy["spec"]["variables"] if v["name"] == "asksForGpus")
    quoted = set(re.findall(r'"([^"]+)"', asks["expression"]))
    listed = quoted - {"nvidia.com/mig-", "deviceclass.resource.kubernetes.io/", ".biaxial.dev"}
    assert listed == GPU_RESOURCES | GPU_ANNOTATIONS


def test_the_chart_installs_no_policy_by_default() -> None:
    assert not [r for r in render_objects() if r.kind.startswith("MutatingAdmission")]


@pytest.mark.parametrize(
    ("version", "api_version"),
    [("1.37", "admissionregistration.k8s.io/v1"), ("1.34", "admissionregistration.k8s.io/v1beta1")],
)
def test_the_chart_policy_validates_strictly(version: str, api_version: str) -> None:
    values = copy.deepcopy(VALUES)
    values["admission"]["apiVersion"] = api_version
    rendered = [r.obj for r in render_objects(values) if r.kind.startswith("MutatingAdmission")]
    assert [o["apiVersion"] for o in rendered] == [api_version, api_version]
    assert [validate_object(o, version) for o in rendered] == [[], []]

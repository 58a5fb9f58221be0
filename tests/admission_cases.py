"""The admission table: one case per rule of :mod:`driver.scheduling.admission`.

Both the pure function (``tests/unit/test_admission.py``) and the chart's
MutatingAdmissionPolicy on the real API server (``tests/apiserver/test_admission.py``) are
driven by :data:`CASES`: each case is a pod as its author wrote it and what admission must
leave on it in an opted-in namespace (``after``: the scheduler name, ``nvidia.com/gpu`` per
container, the note); outside the scope every pod is left as written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

JSON = dict[str, Any]
IMAGE: Final = "registry.k8s.io/pause:3.10"
#: The scope the table is written for: the chart values ``admission.*``.
OPT_IN_LABEL: Final = "biaxial.dev/admission"
SCHEDULERS: Final = ("default-scheduler", "hami-scheduler", "volcano", "kai-scheduler")
VALUES: Final[JSON] = {
    "admission": {
        "enabled": True,
        "namespaceSelector": {"matchLabels": {OPT_IN_LABEL: "enabled"}},
        "schedulers": list(SCHEDULERS),
    }
}
IN_SCOPE: Final = {OPT_IN_LABEL: "enabled"}
OUT_OF_SCOPE: Final[dict[str, str]] = {}


def container(name: str, **limits: str) -> JSON:
    out: JSON = {"name": name, "image": IMAGE}
    if limits:
        out["resources"] = {"limits": {k.replace("__", "/"): v for k, v in limits.items()}}
    return out


def pod(
    name: str,
    *containers: JSON,
    scheduler: str | None = None,
    annotations: dict[str, str] | None = None,
    init: list[JSON] | None = None,
    **spec: Any,
) -> JSON:
    body: JSON = {"containers": list(containers) or [container("main")], **spec}
    if scheduler is not None:
        body["schedulerName"] = scheduler
    if init:
        body["initContainers"] = init
    meta: JSON = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


@dataclass(frozen=True)
class After:
    """What the pod carries after admission in an opted-in namespace."""

    scheduler: str = "biaxial"
    gpus: dict[str, str] = field(default_factory=dict)  # "containers[0]" -> nvidia.com/gpu
    note: str | None = None


@dataclass(frozen=True)
class Case:
    pod: JSON
    after: After | None  # None: untouched

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


GPU: Final = "nvidia.com__gpu"
CASES: Final = (
    Case(
        pod("kai-fraction", scheduler="kai-scheduler", annotations={"gpu-fraction": "0.5"}),
        After(
            gpus={"containers[0]": "1"},
            note="schedulerName: kai-scheduler -> biaxial; containers[0] (main) nvidia.com/gpu: 1",
        ),
    ),
    Case(
        pod(
            "kai-memory-named",
            container("sidecar"),
            container("worker", cpu="1"),
            scheduler="kai-scheduler",
            annotations={
                "gpu-memory": "4000",
                "gpu-fraction-container-name": "worker",
                "gpu-fraction-num-devices": "2",
            },
        ),
        After(
            gpus={"containers[1]": "2"},
            note=(
                "schedulerName: kai-scheduler -> biaxial; containers[1] (worker) nvidia.com/gpu: 2"
            ),
        ),
    ),
    Case(
        pod(
            "kai-init-container",
            init=[container("setup")],
            scheduler="kai-scheduler",
            annotations={"gpu-fraction": "0.25", "gpu-fraction-container-name": "setup"},
        ),
        After(
            gpus={"initContainers[0]": "1"},
            note=(
                "schedulerName: kai-scheduler -> biaxial; "
                "initContainers[0] (setup) nvidia.com/gpu: 1"
            ),
        ),
    ),
    Case(
        pod(
            "kai-already-asks",
            container("main", **{GPU: "1"}),
            scheduler="kai-scheduler",
            annotations={"gpu-fraction": "0.5"},
        ),
        After(gpus={"containers[0]": "1"}, note="schedulerName: kai-scheduler -> biaxial"),
    ),
    Case(
        pod(
            "kai-bad-count",
            scheduler="kai-scheduler",
            annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "two"},
        ),
        After(note="schedulerName: kai-scheduler -> biaxial"),
    ),
    Case(
        pod(
            "kai-huge-count",
            scheduler="kai-scheduler",
            annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "9" * 20},
        ),
        After(note="schedulerName: kai-scheduler -> biaxial"),
    ),
    Case(
        pod(
            "kai-unknown-container",
            annotations={"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"},
        ),
        After(note="schedulerName: default-scheduler -> biaxial"),
    ),
    Case(
        pod(
            "kai-on-biaxial",
            scheduler="biaxial",
            annotations={"gpu-fraction": "0.5", "team": "a"},
        ),
        After(gpus={"containers[0]": "1"}, note="containers[0] (main) nvidia.com/gpu: 1"),
    ),
    Case(
        pod("hami", container("main", **{GPU: "1", "nvidia.com__gpumem": "4000"})),
        After(gpus={"containers[0]": "1"}, note="schedulerName: default-scheduler -> biaxial"),
    ),
    Case(
        pod(
            "hami-named",
            container("main", **{GPU: "2", "nvidia.com__gpucores": "30"}),
            scheduler="hami-scheduler",
        ),
        After(gpus={"containers[0]": "2"}, note="schedulerName: hami-scheduler -> biaxial"),
    ),
    Case(
        pod("hami-annotation-only", annotations={"nvidia.com/use-gputype": "A100"}),
        After(note="schedulerName: default-scheduler -> biaxial"),
    ),
    Case(
        pod(
            "volcano",
            container(
                "main",
                **{"volcano.sh__vgpu-number": "1", "volcano.sh__vgpu-memory": "2000"},
            ),
            scheduler="volcano",
        ),
        After(note="schedulerName: volcano -> biaxial"),
    ),
    Case(
        pod("device-plugin", container("main", **{GPU: "2"})),
        After(gpus={"containers[0]": "2"}, note="schedulerName: default-scheduler -> biaxial"),
    ),
    Case(
        pod("device-plugin-mig", container("main", **{"nvidia.com__mig-1g.10gb": "1"})),
        After(note="schedulerName: default-scheduler -> biaxial"),
    ),
    Case(
        pod("gpu-in-init", init=[container("warmup", **{GPU: "1"})]),
        After(gpus={"initContainers[0]": "1"}, note="schedulerName: default-scheduler -> biaxial"),
    ),
    Case(
        pod(
            "implicit-class",
            container("main", **{"deviceclass.resource.kubernetes.io__gpu.biaxial.dev": "1"}),
        ),
        After(note="schedulerName: default-scheduler -> biaxial"),
    ),
    Case(
        pod(
            "other-class",
            container("main", **{"deviceclass.resource.kubernetes.io__gpu.example.com": "1"}),
        ),
        None,
    ),
    Case(pod("cpu-only", container("main", cpu="1")), None),
    Case(pod("other-scheduler", container("main", **{GPU: "1"}), scheduler="my-scheduler"), None),
    Case(pod("already-biaxial", container("main", **{GPU: "1"}), scheduler="biaxial"), None),
    Case(pod("bound", container("main", **{GPU: "1"}), nodeName="somewhere"), None),
    Case(
        pod(
            "claims-only",
            resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        ),
        None,
    ),
)
#: The four sources the issue names, by case name.
SOURCES: Final = ("kai-fraction", "hami", "volcano", "device-plugin")


def observed(pod: JSON) -> After:
    """What the table compares on a pod: its scheduler, each container's ``nvidia.com/gpu``
    (limits; requests, where given, must say the same) and the admission note."""
    spec = pod["spec"]
    gpus: dict[str, str] = {}
    for part in ("containers", "initContainers"):
        for index, c in enumerate(spec.get(part) or ()):
            resources = c.get("resources") or {}
            limit = (resources.get("limits") or {}).get("nvidia.com/gpu")
            request = (resources.get("requests") or {}).get("nvidia.com/gpu", limit)
            assert request == limit, (pod["metadata"]["name"], part, index, resources)
            if limit is not None:
                gpus[f"{part}[{index}]"] = str(limit)
    note = (pod["metadata"].get("annotations") or {}).get("biaxial.dev/admission")
    return After(spec.get("schedulerName") or "default-scheduler", gpus, note)


def expected(case: Case, *, in_scope: bool) -> After:
    """What :func:`observed` must find on the case's pod after admission."""
    if in_scope and case.after is not None:
        return case.after
    return observed(case.pod)

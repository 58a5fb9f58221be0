"""The chart's admission step in ``biaxial simulate``: its scope from the chart values.

``--admission`` models the step with the chart's default ``admission.*`` values
(:data:`DEFAULT_VALUES`, the same as ``deploy/helm/biaxial/values.yaml``) but in every
namespace, as manifests seldom carry their Namespace objects; ``--admission-values FILE``
reads a Helm values file as the chart does (its ``admission.*`` and
``controller.schedulerName`` over the defaults; the namespace selector included, with
``kube-system`` and the release's namespace, ``biaxial-system`` unless ``namespace`` is given,
left out as the chart's binding does). The mutation itself is
:func:`driver.scheduling.admission.admit`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from driver.api.errors import ManifestError
from driver.api.labels import LabelSelector, requirement
from driver.scheduling.admission import AdmissionScope

RELEASE_NAMESPACE: Final = "biaxial-system"
NAME_LABEL: Final = "kubernetes.io/metadata.name"
#: The chart's defaults (values.yaml ``admission``), apart from ``enabled``.
DEFAULT_VALUES: Final[Mapping[str, Any]] = {
    "namespaceSelector": {"matchLabels": {"biaxial.dev/admission": "enabled"}},
    "schedulers": ["default-scheduler", "hami-scheduler", "volcano", "kai-scheduler"],
}
DEFAULT_SCHEDULER_NAME: Final = "biaxial"
#: ``admission.mechanism``: a MutatingAdmissionPolicy or the controller's webhook; the same
#: change either way, so the scope does not depend on it
MECHANISMS: Final = ("policy", "webhook")


def everywhere() -> AdmissionScope:
    """``--admission``: the chart's default schedulers, every namespace."""
    return AdmissionScope(
        LabelSelector(), frozenset(DEFAULT_VALUES["schedulers"]), DEFAULT_SCHEDULER_NAME
    )


def from_values(values: Mapping[str, Any], namespace: str = RELEASE_NAMESPACE) -> AdmissionScope:
    """The scope the chart's policy has with these values (see the module docstring)."""
    where = "admission values"
    raw = values.get("admission") or {}
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where}: admission must be a mapping")
    merged = {**DEFAULT_VALUES, **raw}
    mechanism = raw.get("mechanism", "policy")
    if mechanism not in MECHANISMS:
        raise ManifestError(
            f"{where}: admission.mechanism {mechanism!r} is not one of {', '.join(MECHANISMS)} "
            "(the chart refuses it too)"
        )
    schedulers = merged["schedulers"]
    if not isinstance(schedulers, list) or not all(isinstance(s, str) for s in schedulers):
        raise ManifestError(f"{where}: admission.schedulers must be a list of scheduler names")
    controller = values.get("controller") or {}
    name = str(controller.get("schedulerName") or DEFAULT_SCHEDULER_NAME)
    selector = LabelSelector.from_api(merged["namespaceSelector"] or {}, where).merged(
        [requirement(NAME_LABEL, "NotIn", ("kube-system", namespace), where)]
    )
    return AdmissionScope(selector, frozenset(schedulers), name)


def load_values(path: str) -> Mapping[str, Any]:
    """A Helm values file (YAML); ManifestError when unreadable."""
    import yaml  # noqa: PLC0415 - only for the CLI

    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ManifestError(f"--admission-values {path}: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, Mapping):
        raise ManifestError(f"--admission-values {path}: not a mapping of values")
    return loaded


def namespace_labels(name: str, given: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """A namespace's labels as the API server has them: the given Namespace's (none when it
    is not given) and ``kubernetes.io/metadata.name``, which the server always sets."""
    return {**given.get(name, {}), NAME_LABEL: name}

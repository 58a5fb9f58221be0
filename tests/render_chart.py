"""Render the Helm chart ``deploy/helm/biaxial`` without a ``helm`` binary, and keep the plain
manifests in ``deploy/manifests/`` in step with it.

Usage::

    python -m tests.render_chart            # (re)write deploy/manifests/*.yaml
    python -m tests.render_chart --check    # exit 1 when a file there is stale (make check)

How: the chart is rendered by Helm's own Go template engine (Helm SDK v4) through the
``helm-python-sdk`` distribution, which ships ``libhelm_c`` (a C ABI over the official Helm Go
SDK) inside its wheel and binds it with ``ctypes``. So ``sprig`` functions, ``include``,
``toYaml``, ``with``/``range`` scoping and whitespace trimming behave exactly as ``helm
template`` does; nothing here re-implements Go templates.

Each variant in :data:`VARIANTS` becomes one file: a ``Namespace`` object first (``helm
install --create-namespace`` does that for Helm users), then every rendered object in Helm's
install order, each preceded by a ``# Source:`` comment as ``helm template`` prints it.
:func:`render_objects` is the entry point for tests: values in, parsed objects out.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

ROOT: Final = Path(__file__).resolve().parent.parent
CHART: Final = ROOT / "deploy" / "helm" / "biaxial"
MANIFESTS: Final = ROOT / "deploy" / "manifests"
RELEASE: Final = "biaxial"
NAMESPACE: Final = "biaxial-system"

#: deploy/manifests/<file> -> the values it is rendered with (on top of values.yaml).
VARIANTS: Final[Mapping[str, Mapping[str, Any]]] = {
    "biaxial.yaml": {},
    # Clusters without GPUs (kind, CI): 4 fake T4s on every node labelled
    # biaxial.dev/fake-gpus=true; nvidia.com/gpumem and gpucores advertised on the Node so the
    # kubelet admits HAMi-style pods (docs/requesting-gpus.md); shares time-sliced (strategy
    # none, the only one the class and the nodes allow: nothing could enforce another) and no
    # HAMi-core library installed: there is no CUDA to intercept, and the kind script builds
    # the image without it (HAMI_CORE=none).
    "biaxial-fake-gpus.yaml": {
        "kubeletPlugin": {
            "fakeGpus": "t4x4",
            "nodeSelector": {"nvidia.com/gpu.present": None, "biaxial.dev/fake-gpus": "true"},
            "tolerations": None,
            "advertiseLegacyResources": True,
            "hamiCoreLibrary": "",
            "shareStrategies": ["none"],
        },
        "deviceClasses": {"sharingStrategy": "none", "allowedSharingStrategies": ["none"]},
    },
    # The admission step as the controller's mutating webhook (docs/migration.md), for
    # clusters without MutatingAdmissionPolicy, with a serving certificate you provide: the
    # Secret biaxial-admission-webhook-tls (kubectl create secret tls) and its CA patched into
    # the configuration's caBundle. (The chart can also make the certificate, or have
    # cert-manager make it: admission.webhook.tls.source; neither fits a static file.)
    "biaxial-admission-webhook.yaml": {
        "admission": {
            "enabled": True,
            "mechanism": "webhook",
            "webhook": {"tls": {"source": "secret", "secretName": "biaxial-admission-webhook-tls"}},
        },
    },
}

# Helm's install order (pkg/release/util/kind_sorter.go), trimmed to the kinds we emit.
_INSTALL_ORDER: Final = (
    "Namespace",
    "ServiceAccount",
    "Secret",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Deployment",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
)


class RenderError(RuntimeError):
    """The chart did not render (template error, bad values) or rendered malformed YAML."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """One rendered object and the template it came from."""

    source: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.obj.get("metadata") or {}).get("name", ""))


def _order(item: Rendered) -> tuple[int, str, str]:
    try:
        rank = _INSTALL_ORDER.index(item.kind)
    except ValueError:
        rank = len(_INSTALL_ORDER)  # unknown kinds last, as Helm does
    return rank, item.kind, item.name


def render_objects(
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    chart: Path = CHART,
) -> list[Rendered]:
    """Render the chart with ``values`` and return its objects in Helm's install order."""
    import helm_python as helm  # native library: load it only when rendering

    try:
        with helm.Chart.load(str(chart)) as loaded:
            files = loaded.render(dict(values or {}), name=release, namespace=namespace)
    except helm.HelmError as exc:
        raise RenderError(f"{chart}: helm render failed: {exc}") from exc
    out: list[Rendered] = []
    for source, text in sorted(files.items()):
        if not source.endswith((".yaml", ".yml")) or not text.strip():
            continue  # NOTES.txt, _helpers.tpl, disabled templates
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise RenderError(f"{source}: rendered output is not YAML: {exc}") from exc
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc:
                raise RenderError(f"{source}: rendered a document that is not an object")
            out.append(Rendered(source, doc))
    return sorted(out, key=_order)


def manifest_text(values: Mapping[str, Any], *, namespace: str = NAMESPACE) -> str:
    """One multi-document YAML file: the Namespace, then every rendered object."""
    header = (
        "# Generated from deploy/helm/biaxial by `python -m tests.render_chart`; do not edit.\n"
        f"# Values: {yaml.safe_dump(dict(values), default_flow_style=True, width=1000).strip()}\n"
        f"#   kubectl apply --server-side -f <this file>\n"
    )
    ns = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": {"app.kubernetes.io/name": "biaxial"}},
    }
    parts = [header + yaml.safe_dump(ns, sort_keys=False)]
    for item in render_objects(values, namespace=namespace):
        body = yaml.safe_dump(item.obj, sort_keys=False, width=100)
        parts.append(f"# Source: {item.source}\n{body}")
    return "---\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.render_chart", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="fail when deploy/manifests/ is stale; write nothing"
    )
    args = parser.parse_args(argv)
    stale: list[str] = []
    try:
        for filename, values in VARIANTS.items():
            path = MANIFESTS / filename
            wanted = manifest_text(values)
            current = path.read_text(encoding="utf-8") if path.exists() else ""
            if current == wanted:
                continue
            if args.check:
                diff = difflib.unified_diff(
                    current.splitlines(), wanted.splitlines(), str(path), "rendered", lineterm=""
                )
                stale.append("\n".join(list(diff)[:40]))
            else:
                MANIFESTS.mkdir(parents=True, exist_ok=True)
                path.write_text(wanted, encoding="utf-8")
                print(f"render_chart: wrote {path.relative_to(ROOT)}", file=sys.stderr)
    except RenderError as exc:
        print(f"render_chart: {exc}", file=sys.stderr)
        return 2
    if stale:
        print("\n".join(stale))
        print(
            f"render_chart: {len(stale)} file(s) in deploy/manifests/ are stale; "
            "run `python -m tests.render_chart` and commit the result",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

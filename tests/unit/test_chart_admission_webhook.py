"""The chart's admission webhook (``admission.mechanism: webhook``), rendered by Helm's own
engine: the configuration (upstream's rules for a ``MutatingWebhookConfiguration``:
``admissionReviewVersions``, ``sideEffects``, ``timeoutSeconds`` 1-30, ``failurePolicy``,
``reinvocationPolicy``, the service reference and its ``caBundle``), the three sources of its
serving certificate, the controller's arguments, port and certificate volume, and the
matchConditions, evaluated with CEL over the admission table: every pod admission changes is
sent to the webhook, and the pods it never changes that the conditions can tell are not.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
from typing import Any

import pytest

from biaxial.cli import build_parser
from biaxial.commands import controller as controller_cmd
from driver.scheduling.admission import admit
from tests.admission_cases import CASES, IN_SCOPE, SCHEDULERS, VALUES, Case
from tests.render_chart import NAMESPACE, RenderError, render_objects
from tests.unit.test_admission import SCOPE
from tests.validate_manifests import validate_object

JSON = dict[str, Any]
MWC = "MutatingWebhookConfiguration"
CERT_MANAGER = "cert-manager.io/v1"


def webhook_values(**tls: Any) -> JSON:
    values = copy.deepcopy(VALUES)
    values["admission"]["mechanism"] = "webhook"
    if tls:
        values["admission"]["webhook"] = {"tls": tls}
    return values


def render(values: JSON) -> list[JSON]:
    return [r.obj for r in render_objects(values)]


def one(objs: list[JSON], kind: str) -> JSON:
    (found,) = [o for o in objs if o["kind"] == kind]
    return found


def controller_container(objs: list[JSON]) -> JSON:
    deployment = one(objs, "Deployment")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(c)


@pytest.mark.parametrize(
    "tls",
    [
        {},
        {"source": "certManager"},
        {
            "source": "certManager",
            "certManager": {"issuerRef": {"kind": "ClusterIssuer", "name": "ca"}},
        },
        {"source": "secret", "secretName": "mine", "caBundle": base64.b64encode(b"x").decode()},
    ],
    ids=["helm", "cert-manager self-signed", "cert-manager issuer", "secret"],
)
def test_the_webhook_render_validates_and_wires_the_certificate_through(tls: JSON) -> None:
    objs = render(webhook_values(**tls))
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    for obj in objs:
        if obj["apiVersion"] == CERT_MANAGER:
            continue  # no schema in kubernetes-validate; their shape is checked below
        for version in ("1.34", "1.37"):
            assert validate_object(obj, version) == [], (obj["kind"], obj["metadata"]["name"])
    (hook,) = one(objs, MWC)["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == "Ignore"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert 1 <= hook["timeoutSeconds"] <= 30  # the API server's bounds
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"] == {
        "matchLabels": {"biaxial.dev/admission": "enabled"},
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            }
        ],
    }
    service = one(objs, "Service")
    assert hook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": NAMESPACE,
        "path": "/mutate-pods",
        "port": 443,
    }
    container = controller_container(objs)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == 443]
    assert port["targetPort"] == "webhook"
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "admission-cert"]
    secret_name = volume["secret"]["secretName"]
    source = tls.get("source", "helm")
    annotations = one(objs, MWC)["metadata"].get("annotations", {})
    if source == "helm":
        secret = one(objs, "Secret")
        assert secret["metadata"]["name"] == secret_name
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        _check_signed(secret, service["metadata"]["name"])
    elif source == "certManager":
        certificate = one(objs, "Certificate")
        assert certificate["apiVersion"] == CERT_MANAGER
        assert certificate["spec"]["secretName"] == secret_name
        assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
        assert annotations == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{certificate['metadata']['name']}"
        }
        assert "caBundle" not in hook["clientConfig"]  # cert-manager's cainjector fills it
        issuer = certificate["spec"]["issuerRef"]
        if "issuerRef" in tls.get("certManager", {}):
            assert issuer == {"kind": "ClusterIssuer", "name": "ca"}
            assert "Issuer" not in kinds
        else:
            assert one(objs, "Issuer")["metadata"]["name"] == issuer["name"]
            assert one(objs, "Issuer")["spec"] == {"selfSigned": {}}
    else:
        assert secret_name == "mine"
        assert "Secret" not in kinds
        assert hook["clientConfig"]["caBundle"] == tls["caBundle"]


def _check_signed(secret: JSON, service: str) -> None:
    """The chart-made certificate is signed by the CA it ships and names the Service."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert cert.issuer == ca.subject
    key = ca.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PKCS1v15(),
            cert.signature_hash_algorithm,
        )
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{service}.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    assert cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=3000)


def test_the_controller_serves_what_the_configuration_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rendered arguments parse with the real CLI and give the webhook's settings (the
    certificate files are the mounted Secret's, absent here: only they fail validation)."""
    container = controller_container(render(webhook_values()))
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "admission-cert"]
    assert mount == {
        "name": "admission-cert",
        "mountPath": "/etc/biaxial/admission",
        "readOnly": True,
    }
    args = build_parser().parse_args(container["args"])
    monkeypatch.setenv("BIAXIAL_IDENTITY", "biaxial-controller-abc")
    with pytest.raises(
        Exception, match="--admission-tls-cert-file: the admission webhook is served over HTTPS"
    ):
        controller_cmd.settings_from_args(args)
    assert f"--admission-tls-cert-file={mount['mountPath']}/tls.crt" in container["args"]
    assert f"--admission-schedulers={','.join(SCHEDULERS)}" in container["args"]
    assert "--admission-webhook-port=9443" in container["args"]


def test_policy_and_webhook_are_one_or_the_other() -> None:
    policy = {o["kind"] for o in render(VALUES)}
    assert {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"} <= policy
    assert MWC not in policy
    args = controller_container(render(VALUES))["args"]
    assert not [a for a in args if a.startswith("--admission")]
    off = render({})
    assert not [o for o in off if o["kind"] in {MWC, "MutatingAdmissionPolicy", "Secret"}]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"admission": {"enabled": True, "mechanism": "both"}},
            'admission.mechanism: "both" is not one of policy, webhook',
        ),
        (
            {
                "admission": {
                    "enabled": True,
                    "mechanism": "webhook",
                    "webhook": {"tls": {"source": "vault"}},
                }
            },
            'admission.webhook.tls.source: "vault" is not one of helm, certManager, secret',
        ),
        (
            {
                "admission": {
                    "enabled": True,
                    "mechanism": "webhook",
                    "webhook": {"tls": {"source": "secret"}},
                }
            },
            "admission.webhook.tls.secretName: the kubernetes.io/tls Secret",
        ),
        (
            {
                "admission": {"enabled": True, "mechanism": "webhook"},
                "controller": {"enabled": False},
            },
            "the controller serves the webhook; set controller.enabled",
        ),
    ],
)
def test_bad_admission_values_fail_the_render_with_the_reason(values: JSON, message: str) -> None:
    with pytest.raises(RenderError, match=message.replace(".", r"\.").replace("(", r"\(")):
        render_objects(values)


def _conditions() -> list[str]:
    (hook,) = one(render(webhook_values(source="secret", secretName="s")), MWC)["webhooks"]
    return [c["expression"] for c in hook["matchConditions"]]


def _sent(pod: JSON) -> bool:
    """The configuration's matchConditions on ``pod``, evaluated as the API server does (CEL
    with optionals and strings); an expression that errors fails the test."""
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_optional, ext_strings

    t = cel.Type
    env = cel.NewEnv(
        None,
        variables=dict.fromkeys(("request", "object", "oldObject"), t.DYN),
        extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()],
    )
    inputs = {"request": {"operation": "CREATE"}, "object": pod, "oldObject": None}
    verdicts = []
    for expression in _conditions():
        result = env.compile(expression).eval(env.Activation(inputs))
        assert result.type() != t.ERROR, f"{expression}: {result.value()}"
        verdicts.append(result.value())
    return all(verdicts)


NOT_SENT = {"cpu-only", "other-scheduler", "bound", "claims-only", "other-class"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_match_conditions_send_every_pod_admission_changes(case: Case) -> None:
    changed = admit(case.pod, IN_SCOPE, SCOPE) is not None
    sent = _sent(case.pod)
    assert sent or not changed
    assert sent == (case.name not in NOT_SENT)


def test_the_webhook_needs_no_rbac() -> None:
    """The webhook reads only the pod in the review: turning it on grants nothing."""
    kinds = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"}
    default = [o for o in render({}) if o["kind"] in kinds]
    for tls in ({}, {"source": "certManager"}):
        assert [o for o in render(webhook_values(**tls)) if o["kind"] in kinds] == default

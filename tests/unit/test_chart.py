"""The Helm chart ``deploy/helm/biaxial``, rendered by Helm's own engine (``tests.render_chart``):
strict schema validity for 1.34 and 1.37 in several value sets, least-privilege RBAC exactly as
the reference lists it, the ResourceSlice admission policy, and the contract with the binaries
(every rendered argument parses with the real CLI and gives settings that validate).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from biaxial.cli import build_parser
from biaxial.commands import controller as controller_cmd
from biaxial.commands import kubelet_plugin as plugin_cmd
from tests.render_chart import CHART, MANIFESTS, NAMESPACE, VARIANTS, manifest_text, render_objects
from tests.validate_manifests import validate_object

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("1.34", "1.37")
JSON = dict[str, Any]


@functools.cache
def _render_cached(key: str) -> list[JSON]:
    values = yaml.safe_load(key)
    return [r.obj for r in render_objects(values)]


def render(values: Mapping[str, Any] | None = None) -> list[JSON]:
    return _render_cached(yaml.safe_dump(dict(values or {}), sort_keys=True))


def one(objs: list[JSON], kind: str, name: str | None = None) -> JSON:
    found = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} x {kind} {name or ''}"
    return found[0]


VAP = "ValidatingAdmissionPolicy"


def rules(objs: list[JSON], kind: str, name: str) -> list[JSON]:
    rules_: list[JSON] = one(objs, kind, name)["rules"]
    return rules_


def grants(rule_list: list[JSON], resource: str, group: str = "") -> set[str]:
    verbs: set[str] = set()
    for rule in rule_list:
        if resource in rule["resources"] and group in rule["apiGroups"]:
            verbs |= set(rule["verbs"])
    return verbs


def container(objs: list[JSON], kind: str) -> JSON:
    workload = one(objs, kind)
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: JSON = containers[0]
    return c


# --------------------------------------------------------------------------- validity

VALUE_SETS: dict[str, Mapping[str, Any]] = {
    "defaults": {},
    **{f"variant {name}": values for name, values in VARIANTS.items()},
    "everything on": {
        "verbosity": 2,
        "kubeletPlugin": {
            "advertiseLegacyResources": True,
            "removeSlicesOnExit": True,
            "hamiCoreLibrary": "/usr/local/vgpu/libvgpu.so",
            "runtimeClassName": "nvidia",
            "hostIPC": True,
            "extraArgs": ["--resync-seconds=30"],
            "extraEnv": [{"name": "BIAXIAL_XID_QUIET_SECONDS", "value": "120"}],
        },
        "controller": {"extraArgs": ["--qps=50"], "nodePolicy": "spread"},
        "imagePullSecrets": [{"name": "regcred"}],
        "commonLabels": {"team": "ml-platform"},
    },
    "leader election off, controller only": {
        "kubeletPlugin": {"enabled": False},
        "controller": {"replicas": 1, "leaderElection": {"enabled": False}},
    },
}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_validates_strictly(values: Mapping[str, Any]) -> None:
    objs = render(values)
    assert objs
    for obj in objs:
        for version in VERSIONS:
            assert validate_object(obj, version) == [], (obj["kind"], obj["metadata"]["name"])


def test_default_render_has_the_expected_objects() -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in render())
    assert kinds == sorted(
        [
            ("ClusterRole", "biaxial-controller"),
            ("ClusterRole", "biaxial-kubelet-plugin"),
            ("ClusterRoleBinding", "biaxial-controller"),
            ("ClusterRoleBinding", "biaxial-kubelet-plugin"),
            ("DaemonSet", "biaxial-kubelet-plugin"),
            ("Deployment", "biaxial-controller"),
            ("DeviceClass", "gpu.biaxial.dev"),
            ("DeviceClass", "mig.biaxial.dev"),
            *(
                ("DeviceClass", f"mig-{profile}.biaxial.dev")
                for profile in (
                    "1g.5gb",
                    "1g.10gb",
                    "1g.20gb",
                    "2g.10gb",
                    "2g.20gb",
                    "3g.20gb",
                    "3g.40gb",
                    "4g.20gb",
                    "4g.40gb",
                    "7g.40gb",
                    "7g.80gb",
                )
            ),
            ("Role", "biaxial-controller-leader-election"),
            ("Role", "biaxial-kubelet-plugin-events"),
            ("RoleBinding", "biaxial-controller-leader-election"),
            ("RoleBinding", "biaxial-kubelet-plugin-events"),
            ("ServiceAccount", "biaxial-controller"),
            ("ServiceAccount", "biaxial-kubelet-plugin"),
            ("ValidatingAdmissionPolicy", "biaxial-claim-protection"),
            ("ValidatingAdmissionPolicy", "biaxial-resourceslices"),
            ("ValidatingAdmissionPolicyBinding", "biaxial-claim-protection"),
            ("ValidatingAdmissionPolicyBinding", "biaxial-resourceslices"),
        ]
    )
    for obj in render():
        if obj["kind"] not in {"ClusterRole", "ClusterRoleBinding", "DeviceClass"} and not (
            obj["kind"].startswith("ValidatingAdmissionPolicy")
        ):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]


def test_mig_profile_classes_can_be_left_out() -> None:
    classes = [
        o for o in render({"deviceClasses": {"migProfiles": []}}) if o["kind"] == "DeviceClass"
    ]
    assert sorted(o["metadata"]["name"] for o in classes) == ["gpu.biaxial.dev", "mig.biaxial.dev"]


def test_helm_lint_strict_finds_nothing_above_info() -> None:
    import helm_python as helm

    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert report["total_charts_linted"] == 1
    # Severity 1 is INFO ("icon is recommended"); 2 WARNING, 4 ERROR.
    assert [m for m in report["messages"] if m["severity"] > 1] == []


@pytest.mark.parametrize("filename", sorted(VARIANTS))
def test_plain_manifests_are_fresh_and_start_with_the_namespace(filename: str) -> None:
    path = MANIFESTS / filename
    assert path.read_text(encoding="utf-8") == manifest_text(VARIANTS[filename]), (
        f"{path} is stale: run `python -m tests.render_chart`"
    )
    first = next(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
    assert (first["kind"], first["metadata"]["name"]) == ("Namespace", NAMESPACE)


SECURE_METRICS: dict[str, Any] = {
    "controller": {"metricsAuth": {"enabled": True, "tlsSecretName": "biaxial-serving"}},
    "kubeletPlugin": {"metricsAddress": "0.0.0.0"},
}


def test_service_monitor_option() -> None:
    assert not [o for o in render() if o["kind"] == "ServiceMonitor"]
    # /metrics on loopback (the default): nothing outside the pod could scrape a Service
    monitored = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "p"}}}}
    assert not [o for o in render(monitored) if o["kind"] in {"Service", "ServiceMonitor"}]
    objs = render({**monitored, **SECURE_METRICS})
    monitors = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    secure = one(objs, "ServiceMonitor", "biaxial-controller")["spec"]["endpoints"][0]
    assert secure["scheme"] == "https"
    assert secure["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    plain = one(objs, "ServiceMonitor", "biaxial-kubelet-plugin")["spec"]["endpoints"][0]
    assert "scheme" not in plain
    services = [o for o in objs if o["kind"] == "Service"]
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "p"
        selector = monitor["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
        assert len(matched) == 1
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


# --------------------------------------------------------------------------- device classes


# Every repository class but the product class (an example to copy, not installed).
INSTALLED_CLASSES = [
    p.name.removesuffix(".yaml")
    for p in sorted((ROOT / "deviceclasses").glob("*.yaml"))
    if not p.name.startswith("a100-80gb.")
]


@pytest.mark.parametrize("name", INSTALLED_CLASSES)
def test_device_classes_equal_the_repository_files(name: str) -> None:
    repo = yaml.safe_load((ROOT / "deviceclasses" / f"{name}.yaml").read_text(encoding="utf-8"))
    rendered = one(render(), "DeviceClass", name)
    assert rendered["spec"] == repo["spec"]


def test_driver_name_and_extended_resource_values_reach_every_place() -> None:
    objs = render({"driverName": "gpu.example.org", "deviceClasses": {"extendedResourceName": ""}})
    gpu = one(objs, "DeviceClass", "gpu.biaxial.dev")
    assert "extendedResourceName" not in gpu["spec"]
    assert 'device.driver == "gpu.example.org"' in gpu["spec"]["selectors"][0]["cel"]["expression"]
    assert "--driver-name=gpu.example.org" in container(objs, "DaemonSet")["args"]
    assert "--driver-name=gpu.example.org" in container(objs, "Deployment")["args"]
    checks = [
        v["expression"] for v in one(objs, VAP, "biaxial-resourceslices")["spec"]["validations"]
    ]
    assert 'variables.objectDriver == "gpu.example.org"' in checks
    claims = one(objs, VAP, "biaxial-claim-protection")["spec"]
    assert '"gpu.example.org/allocation"' in claims["matchConditions"][0]["expression"]
    variables = {v["name"]: v["expression"] for v in claims["variables"]}
    assert 'r.driver == "gpu.example.org"' in variables["holdsOurDevices"]


@pytest.mark.parametrize("strategy", ["hami-core", "mps", "none"])
def test_class_sharing_strategy_is_a_gpu_config_the_plugin_accepts(strategy: str) -> None:
    from driver.api.config import parse_gpu_config

    values = {"deviceClasses": {"sharingStrategy": strategy, "allowedSharingStrategies": []}}
    gpu = one(render(values), "DeviceClass", "gpu.biaxial.dev")
    (entry,) = gpu["spec"]["config"]
    assert entry["opaque"]["driver"] == "gpu.biaxial.dev"
    parsed = parse_gpu_config(entry["opaque"]["parameters"]).sharing
    assert (parsed.strategy, parsed.allowed) == (strategy, None)
    none = {"deviceClasses": {"sharingStrategy": "", "allowedSharingStrategies": []}}
    assert "config" not in one(render(none), "DeviceClass", "gpu.biaxial.dev")["spec"]
    assert "config" not in one(render(), "DeviceClass", "mig.biaxial.dev")["spec"]


def test_the_shipped_class_enforces_shares_and_no_claim_can_switch_that_off() -> None:
    # Issue 15: with HAMi-core installed by default, a share is limited unless the
    # administrator says otherwise; a tenant's GpuConfig may pick mps, never none.
    from driver.api.config import parse_gpu_config

    gpu = one(render(), "DeviceClass", "gpu.biaxial.dev")
    (entry,) = gpu["spec"]["config"]
    parsed = parse_gpu_config(entry["opaque"]["parameters"]).sharing
    assert parsed.strategy == "hami-core"
    assert parsed.allowed == ("hami-core", "mps")
    allowing = {"deviceClasses": {"allowedSharingStrategies": ["hami-core", "mps", "none"]}}
    (entry,) = one(render(allowing), "DeviceClass", "gpu.biaxial.dev")["spec"]["config"]
    assert parse_gpu_config(entry["opaque"]["parameters"]).sharing.allowed == (
        "hami-core",
        "mps",
        "none",
    )


def test_class_sharing_policy_is_a_gpu_config_the_plugin_accepts() -> None:
    from driver.api.claims import OpaqueConfig
    from driver.api.config import parse_opaque

    values = {
        "deviceClasses": {
            "sharingStrategy": "hami-core",
            "allowedSharingStrategies": ["hami-core", "mps"],
        }
    }
    gpu = one(render(values), "DeviceClass", "gpu.biaxial.dev")
    (entry,) = gpu["spec"]["config"]
    opaque = OpaqueConfig(
        driver=entry["opaque"]["driver"], parameters=entry["opaque"]["parameters"]
    )
    parsed = parse_opaque(opaque, "gpu.biaxial.dev", "class", from_class=True)
    assert parsed is not None
    assert parsed.sharing.strategy == "hami-core"
    assert parsed.sharing.allowed == ("hami-core", "mps")
    for version in ("1.34", "1.37"):
        assert validate_object(gpu, version) == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"sharingStrategy": "none", "allowedSharingStrategies": ["hami-core"]},
            (
                'deviceClasses.sharingStrategy "none" is not in '
                "deviceClasses.allowedSharingStrategies [hami-core]: add it there"
            ),
        ),
        (
            {"sharingStrategy": "none"},  # the shipped policy does not allow none
            (
                'deviceClasses.sharingStrategy "none" is not in '
                "deviceClasses.allowedSharingStrategies [hami-core mps]: add it there"
            ),
        ),
        (
            {"sharingStrategy": "", "allowedSharingStrategies": ["hami-core"]},
            "allowedSharingStrategies needs deviceClasses.sharingStrategy",
        ),
        (
            {"sharingStrategy": "mps", "allowedSharingStrategies": ["mps", "timeslicing"]},
            'allowedSharingStrategies: unknown value "timeslicing"',
        ),
    ],
)
def test_a_bad_class_sharing_policy_fails_the_render(values: dict[str, Any], message: str) -> None:
    from tests.render_chart import RenderError

    with pytest.raises(RenderError, match=re.escape(message)):
        render_objects({"deviceClasses": values})


def test_the_share_cap_reaches_the_plugin() -> None:
    assert "--max-shares-per-gpu=10" in container(render(), "DaemonSet")["args"]
    objs = render({"kubeletPlugin": {"maxSharesPerGpu": 0}})
    assert "--max-shares-per-gpu=0" in container(objs, "DaemonSet")["args"]


def test_the_nodes_sharing_policy_reaches_the_plugin() -> None:
    """No share runs without limits unless the values say so (issue 29, item 5)."""
    assert "--share-strategies=hami-core,mps" in container(render(), "DaemonSet")["args"]
    objs = render({"kubeletPlugin": {"shareStrategies": ["hami-core", "none"]}})
    assert "--share-strategies=hami-core,none" in container(objs, "DaemonSet")["args"]


@pytest.mark.parametrize(
    ("strategies", "message"),
    [
        ([], "kubeletPlugin.shareStrategies: list at least one of hami-core, mps, none"),
        (["mps", "timeslicing"], 'shareStrategies: unknown value "timeslicing"'),
    ],
)
def test_a_bad_node_sharing_policy_fails_the_render(strategies: list[str], message: str) -> None:
    from tests.render_chart import RenderError

    with pytest.raises(RenderError, match=re.escape(message)):
        render_objects({"kubeletPlugin": {"shareStrategies": strategies}})


def test_unknown_class_sharing_strategy_fails_the_render() -> None:
    from tests.render_chart import RenderError

    with pytest.raises(RenderError, match=r"sharingStrategy: unknown value \"mig\""):
        render_objects({"deviceClasses": {"sharingStrategy": "mig"}})


# --------------------------------------------------------------------------- RBAC


def test_no_wildcards_anywhere() -> None:
    objs = render({"kubeletPlugin": {"advertiseLegacyResources": True}})
    for obj in objs:
        for rule in obj.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (obj["metadata"]["name"], rule)


def test_plugin_rbac_is_exactly_what_it_uses() -> None:
    """The plugin lists, watches, creates, updates and deletes its node's slices, gets the
    claims the kubelet names, and gets its Node (tests/integration/test_chart_rbac.py records
    every request it makes). It writes no claim status: no resourceclaims/status and no 1.36
    resourceclaims/driver rule, and it never lists or watches claims."""
    plugin = rules(render(), "ClusterRole", "biaxial-kubelet-plugin")
    res = "resource.k8s.io"
    assert grants(plugin, "resourceslices", res) == {"list", "watch", "create", "update", "delete"}
    assert grants(plugin, "resourceclaims", res) == {"get"}
    assert grants(plugin, "resourceclaims/status", res) == set()
    assert grants(plugin, "resourceclaims/driver", res) == set()
    assert grants(plugin, "resourceclaims/binding", res) == set()
    assert not [r for r in plugin if r.get("resourceNames")]
    assert grants(plugin, "nodes") == {"get"}
    assert grants(plugin, "nodes/status") == set()
    assert grants(plugin, "pods") == set()
    legacy = rules(
        render({"kubeletPlugin": {"advertiseLegacyResources": True}}),
        "ClusterRole",
        "biaxial-kubelet-plugin",
    )
    assert grants(legacy, "nodes/status") == {"patch"}


def test_controller_rbac_is_the_reference_list() -> None:
    objs = render()
    ctl = rules(objs, "ClusterRole", "biaxial-controller")
    res = "resource.k8s.io"
    assert grants(ctl, "pods") == {"get", "list", "watch", "delete"}  # preemption evicts
    assert grants(ctl, "poddisruptionbudgets", "policy") == {"list", "watch"}
    assert grants(ctl, "pods/binding") == {"create"}
    assert grants(ctl, "pods/status") == {"patch", "update"}
    assert grants(ctl, "nodes") == {"list", "watch"}
    for resource in ("resourceslices", "deviceclasses"):
        assert grants(ctl, resource, res) == {"get", "list", "watch"}, resource
    assert grants(ctl, "resourceclaimtemplates", res) == set()  # never read
    assert grants(ctl, "resourceclaims", res) == {
        "get", "list", "watch", "create", "update", "patch", "delete"
    }  # fmt: skip
    assert grants(ctl, "resourceclaims/status", res) == {"update", "patch"}
    assert grants(ctl, "resourceclaims/binding", res) == {"update", "patch"}
    assert grants(ctl, "resourceclaims/driver", res) == set()
    assert grants(ctl, "events") == {"create", "patch"}
    assert grants(ctl, "leases", "coordination.k8s.io") == set()  # namespaced Role only
    lease_role = one(objs, "Role", "biaxial-controller-leader-election")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    lease_rules = lease_role["rules"]
    assert grants(lease_rules, "leases", "coordination.k8s.io") == {"get", "create", "update"}
    named = [r for r in lease_rules if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["biaxial-controller"],
            "verbs": ["get", "update"],
        }
    ]  # create cannot be limited by name: it stands alone


def test_bindings_name_the_chart_service_accounts() -> None:
    objs = render()
    for component in ("kubelet-plugin", "controller"):
        binding = one(objs, "ClusterRoleBinding", f"biaxial-{component}")
        assert binding["roleRef"]["name"] == f"biaxial-{component}"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"biaxial-{component}", "namespace": NAMESPACE}
        ]
    workload = {"kubelet-plugin": "DaemonSet", "controller": "Deployment"}
    for component, kind in workload.items():
        spec = one(objs, kind)["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == f"biaxial-{component}"


def test_resourceslice_policy_restricts_the_plugin_to_its_node() -> None:
    objs = render()
    policy = one(objs, VAP, "biaxial-resourceslices")["spec"]
    binding = one(objs, f"{VAP}Binding", "biaxial-resourceslices")["spec"]
    assert binding == {"policyName": "biaxial-resourceslices", "validationActions": ["Deny"]}
    assert policy["failurePolicy"] == "Fail"
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert "v1" in rule["apiVersions"]
    (condition,) = policy["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:biaxial-kubelet-plugin"' in condition["expression"]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["userNodeName"]
    assert "oldObject" in variables["slice"]
    assert "DELETE" in variables["slice"]
    assert variables["objectPoolName"] == 'variables.slice.spec.?pool.?name.orValue("")'
    checks = [v["expression"] for v in policy["validations"]]
    assert checks[:4] == [
        'variables.userNodeName != ""',
        "variables.userNodeName == variables.objectNodeName",
        "variables.objectPoolName == variables.userNodeName",
        'variables.objectDriver == "gpu.biaxial.dev"',
    ]
    assert checks[4].startswith('request.operation != "UPDATE" ||')
    assert not [
        o["metadata"]["name"]
        for o in render({"resourceSlicePolicy": {"enabled": False}})
        if "Policy" in o["kind"] and "resourceslices" in o["metadata"]["name"]
    ]


def test_claim_protection_policy_guards_allocators_finalizers_on_updates_only() -> None:
    objs = render()
    policy = one(objs, VAP, "biaxial-claim-protection")["spec"]
    binding = one(objs, f"{VAP}Binding", "biaxial-claim-protection")["spec"]
    assert binding == {"policyName": "biaxial-claim-protection", "validationActions": ["Deny"]}
    assert policy["failurePolicy"] == "Fail"
    (rule,) = policy["matchConstraints"]["resourceRules"]
    # finalizers are written through the main resource; a DELETE only marks the claim
    assert rule["resources"] == ["resourceclaims"]
    assert rule["operations"] == ["UPDATE"]
    assert "v1" in rule["apiVersions"]
    (condition,) = policy["matchConditions"]
    assert (
        '["gpu.biaxial.dev/allocation", "resource.kubernetes.io/delete-protection"]'
        in (condition["expression"])
    )
    # no exemption: the controller's own path never removes its finalizer while allocated
    assert "userInfo" not in str(policy)
    for enabled, expected in ((True, 2), (False, 0)):
        objs = render({"claimProtectionPolicy": {"enabled": enabled}})
        assert len([o for o in objs if "claim-protection" in o["metadata"]["name"]]) == expected


# --------------------------------------------------------------------------- workloads


def test_plugin_daemonset_host_paths_env_and_probes() -> None:
    objs = render()
    ds = one(objs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/run/cdi",
        "/var/lib/biaxial",
    } <= set(paths.values())
    c = container(objs, "DaemonSet")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == paths  # host paths are mounted at their own path (CDI specs carry them)
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert not any(a.startswith("--fake-gpus") for a in c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--metrics-port={ports['metrics']}" in c["args"]
    assert "--metrics-address=127.0.0.1" in c["args"]  # the node's metrics stay in the pod
    assert f"--health-port={ports['health']}" in c["args"]
    # A restart does not mend an unreadable checkpoint: it fails readiness, never liveness.
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert c["securityContext"] == PLUGIN_SECURITY_CONTEXT
    assert "hostPID" not in pod
    assert "hostNetwork" not in pod
    assert not [
        v for v in pod["volumes"] if v["hostPath"]["path"] in {"/", "/dev", "/proc", "/sys"}
    ]


# The plugin runs as root (the host directories it writes are root's) but unprivileged.
PLUGIN_SECURITY_CONTEXT = {
    "privileged": False,
    "runAsUser": 0,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def test_plugin_gets_only_the_capabilities_its_options_need() -> None:
    mps = container(render({"kubeletPlugin": {"hostIPC": True}}), "DaemonSet")
    assert mps["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["SETUID", "SETGID"],  # the MPS control daemon starts servers as the client
    }
    mig = container(render({"kubeletPlugin": {"migDevices": True}}), "DaemonSet")
    assert mig["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    env = {e["name"]: e.get("value") for e in mig["env"]}
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    both = container(render({"kubeletPlugin": {"hostIPC": True, "migDevices": True}}), "DaemonSet")
    assert both["securityContext"]["capabilities"]["add"] == ["SETUID", "SETGID", "SYS_ADMIN"]
    dynamic = container(render({"kubeletPlugin": {"dynamicMig": "all"}}), "DaemonSet")
    assert dynamic["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    env = {e["name"]: e.get("value") for e in dynamic["env"]}
    # MIG monitor to list the instances, MIG config to create and destroy them
    assert (env["NVIDIA_MIG_MONITOR_DEVICES"], env["NVIDIA_MIG_CONFIG_DEVICES"]) == ("all", "all")
    assert "--dynamic-mig=all" in dynamic["args"]
    for c in (mps, mig, both, dynamic):
        assert c["securityContext"]["privileged"] is False
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
    default = container(render(), "DaemonSet")
    assert not {"NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES"} & {
        e["name"] for e in default["env"]
    }
    assert not any(a.startswith("--dynamic-mig") for a in default["args"])
    assert "NVIDIA_MIG_CONFIG_DEVICES" not in {e["name"] for e in mig["env"]}
    # the values are not changed by rendering (the capabilities are added to a copy)
    assert container(render(), "DaemonSet")["securityContext"] == PLUGIN_SECURITY_CONTEXT


def test_host_ipc_only_when_asked() -> None:
    assert "hostIPC" not in one(render(), "DaemonSet")["spec"]["template"]["spec"]
    on = one(render({"kubeletPlugin": {"hostIPC": True}}), "DaemonSet")
    assert on["spec"]["template"]["spec"]["hostIPC"] is True


def test_fake_gpus_value() -> None:
    c = container(render({"kubeletPlugin": {"fakeGpus": "a10gx4"}}), "DaemonSet")
    assert "--fake-gpus=a10gx4" in c["args"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in c["env"]}


def test_controller_deployment() -> None:
    objs = render()
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = container(objs, "Deployment")
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "--leader-elect" in c["args"]
    assert f"--lease-namespace={NAMESPACE}" in c["args"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--metrics-port={ports['metrics']}" in c["args"]
    assert f"--health-port={ports['health']}" in c["args"]
    assert not [a for a in c["args"] if a.startswith(("--metrics-bind-address", "--metrics-auth"))]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    env = {e["name"]: e for e in c["env"]}
    assert env["BIAXIAL_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    off = render({"controller": {"leaderElection": {"enabled": False}}})
    assert "--no-leader-elect" in container(off, "Deployment")["args"]
    assert not [
        o
        for o in off
        if o["kind"] in {"Role", "RoleBinding"} and "controller" in o["metadata"]["name"]
    ]


def test_delegated_metrics_auth_gets_its_certificate_and_exactly_the_rbac_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not [o for o in render() if "auth-delegator" in o["metadata"]["name"]]
    from tests.render_chart import RenderError

    with pytest.raises(RenderError, match=re.escape("controller.metricsAuth.tlsSecretName")):
        render_objects({"controller": {"metricsAuth": {"enabled": True}}})
    objs = render(SECURE_METRICS)
    for obj in objs:
        for version in VERSIONS:
            assert validate_object(obj, version) == [], (obj["kind"], obj["metadata"]["name"])
    binding = one(objs, "ClusterRoleBinding", "biaxial-controller-auth-delegator")
    assert binding["roleRef"]["name"] == "system:auth-delegator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "biaxial-controller", "namespace": NAMESPACE}
    ]
    reader = rules(objs, "ClusterRole", "biaxial-metrics-reader")
    assert reader == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    c = container(objs, "Deployment")
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    secret = {v["name"]: v for v in pod["volumes"]}["serving-cert"]["secret"]
    assert secret == {"secretName": "biaxial-serving"}
    mount = {m["name"]: m for m in c["volumeMounts"]}["serving-cert"]
    assert mount["readOnly"] is True
    # the binaries accept what the chart passes, once the Secret's files are there
    cert = tmp_path / "tls.crt"
    cert.write_text("x")
    args = [
        a.replace(mount["mountPath"], str(tmp_path)) if a.startswith("--tls-") else a
        for a in c["args"]
    ]
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("BIAXIAL_IDENTITY", "biaxial-controller-abc")
    (tmp_path / "tls.key").write_text("x")
    ctl = controller_cmd.settings_from_args(build_parser().parse_args(args))
    assert (ctl.metrics_auth, ctl.metrics_bind_address) == ("delegated", "0.0.0.0")


def test_the_plugin_may_create_events_in_its_namespace_and_nothing_else_there() -> None:
    objs = render()
    role = one(objs, "Role", "biaxial-kubelet-plugin-events")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    binding = one(objs, "RoleBinding", "biaxial-kubelet-plugin-events")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "biaxial-kubelet-plugin", "namespace": NAMESPACE}
    ]
    plugin = rules(objs, "ClusterRole", "biaxial-kubelet-plugin")
    assert not [r for r in plugin if "events" in r["resources"]]


# --------------------------------------------------------------------------- contract with the CLI


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_rendered_arguments_are_accepted_by_the_binaries(
    values: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("KUBECONFIG", "NODE_NAME", "POD_UID"):
        monkeypatch.delenv(name, raising=False)
    objs = render(values)
    parser = build_parser()
    for kind in ("DaemonSet", "Deployment"):
        if not [o for o in objs if o["kind"] == kind]:
            continue
        c = container(objs, kind)
        env = {e["name"]: e.get("value") for e in c["env"]}
        for name, value in env.items():
            if value is not None:
                monkeypatch.setenv(name, value)
        args = parser.parse_args([_mounted(a, tmp_path) for a in c["args"]])
        if kind == "DaemonSet":
            assert args.command == "kubelet-plugin"
            monkeypatch.setenv("NODE_NAME", "gpu-node-1")
            monkeypatch.setenv("POD_UID", "0f5c1e9e-2f3a-4a57-9d1e-1c2b3d4e5f60")
            settings = plugin_cmd.settings_from_args(args)
            assert settings.driver_name == "gpu.biaxial.dev"
            assert str(settings.registry_dir) == "/var/lib/kubelet/plugins_registry"
        else:
            assert args.command == "controller"
            monkeypatch.setenv("BIAXIAL_IDENTITY", "biaxial-controller-abc")
            ctl = controller_cmd.settings_from_args(args)
            assert ctl.scheduler_name == "biaxial"


def _mounted(arg: str, root: Path) -> str:
    """A flag naming a file of a mounted Secret (``/etc/biaxial/...``) names a file of that
    name under ``root`` instead, which exists as the mount's would."""
    flag, sep, value = arg.partition("=")
    if not sep or not value.startswith("/etc/biaxial/"):
        return arg
    path = root / value.removeprefix("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return f"{flag}={path}"


# --------------------------------------------------------------------------- the image it runs


def test_dockerfile_copies_every_package_and_runs_unprivileged() -> None:
    import tomllib

    lines = (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines()
    ignore = [
        line
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    # COPY <src>... <dest> from the build context (not --from another stage)
    copied = {
        src.rstrip("/")
        for line in lines
        if line.startswith("COPY ") and "--from=" not in line
        for src in line.split()[1:-1]
    }
    assert packages <= copied, f"Dockerfile does not copy {packages - copied}"
    assert {"pyproject.toml", "README.md", "deviceclasses"} <= copied
    # the context is an allow-list: everything excluded, then what the COPY lines need
    assert ignore[0] == "*"
    allowed = {line.removeprefix("!").rstrip("/") for line in ignore if line.startswith("!")}
    assert copied <= allowed, f".dockerignore excludes {copied - allowed}"
    stages = [line.split()[-1] for line in lines if line.startswith("FROM ") and " AS " in line]
    assert stages == ["hami-core-build", "hami-core-none", "hami-core", "build"]
    assert len([line for line in lines if line.startswith("FROM ")]) == 5  # + the final stage
    assert 'ENTRYPOINT ["biaxial"]' in lines
    # the image installs the locked runtime dependencies with their hashes, nothing resolved anew
    assert "requirements/runtime.lock" in copied
    text = "\n".join(lines)
    assert "pip install --require-hashes -r requirements/runtime.lock" in text
    assert "pip install --no-deps /wheels/biaxial-*.whl" in text
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid not in {"0", "root"}
    # the chart runs the controller as that unprivileged user and only the plugin as root
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert container(render(), "DaemonSet")["securityContext"]["runAsUser"] == 0


# --------------------------------------------------------------------------- the VAP, evaluated

PLUGIN_USER = f"system:serviceaccount:{NAMESPACE}:biaxial-kubelet-plugin"


def _slice(node: str | None, pool: str | None = None, driver: str = "gpu.biaxial.dev") -> JSON:
    """A ResourceSlice as the policy sees it: ``node`` None is a cluster-wide slice; the pool
    is named after the node unless ``pool`` says otherwise."""
    spec: JSON = {"driver": driver, "pool": {"name": pool if pool is not None else node or "x"}}
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"spec": spec}


def _plain(value: Any) -> Any:
    """A CEL result as plain Python (maps and lists included), to feed it back as input."""
    if hasattr(value, "plain_value"):
        value = value.plain_value()
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


#: An ``authorizer`` check in a policy's CEL: ``authorizer.group(...)....check(...).allowed()``.
_AUTHORIZER_CHECK: Final = re.compile(r"authorizer(\s*\.\s*\w+\([^()]*\))+?\s*\.\s*allowed\(\)")


def _admit(
    operation: str,
    user: str,
    node: str | None,
    new: JSON | None = None,
    old: JSON | None = None,
    *,
    policy_name: str = "biaxial-resourceslices",
    allocator: bool = False,
) -> str:
    """Evaluate the chart's policy like the API server: 'skip' (no match), 'allow' or the
    first failing validation's message. An expression that errors fails the test (the API
    server would refuse the request: failurePolicy Fail). This CEL has no ``authorizer``
    library: a check of it is answered ``allocator`` (whether the user may write claims'
    allocations); tests/apiserver/test_claim_protection.py runs the real one."""
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_optional, ext_strings

    policy = one(render(), VAP, policy_name)["spec"]
    t = cel.Type
    env = cel.NewEnv(
        None,
        variables=dict.fromkeys(
            ("request", "object", "oldObject", "variables", "authorized"), t.DYN
        ),
        extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()],
    )
    extra = {} if node is None else {"authentication.kubernetes.io/node-name": [node]}
    inputs: JSON = {
        "request": {"operation": operation, "userInfo": {"username": user, "extra": extra}},
        "object": new,
        "oldObject": old,
        "variables": {},
        "authorized": allocator,
    }

    def run(expression: str) -> Any:
        expression = _AUTHORIZER_CHECK.sub("authorized", expression)
        result = env.compile(expression).eval(env.Activation(inputs))
        assert result.type() != t.ERROR, f"{expression}: {result.value()}"
        return _plain(result.value())

    if not all(run(c["expression"]) for c in policy["matchConditions"]):
        return "skip"
    for variable in policy["variables"]:
        inputs["variables"] = {**inputs["variables"], variable["name"]: run(variable["expression"])}
    for check in policy["validations"]:
        verdict = run(check["expression"])
        assert verdict is True or verdict is False, check["expression"]
        if not verdict:
            if "messageExpression" in check:
                message: str = run(check["messageExpression"])
                return " ".join(message.split())
            return " ".join(check["message"].split())
    return "allow"


OWN = _slice("gpu-1")
OTHER_NODE = _slice("gpu-2")
OTHER_POOL = _slice("gpu-1", pool="gpu-2")  # on its own node, in another node's pool
OTHER_DRIVER = _slice("gpu-1", driver="gpu.nvidia.com")
CLUSTER_WIDE = _slice(None, pool="gpu-1")


@pytest.mark.parametrize(
    ("operation", "user", "node", "objects", "verdict"),
    [
        # its own node's pool, under this driver: every operation is allowed
        ("CREATE", PLUGIN_USER, "gpu-1", (OWN, None), "allow"),
        ("UPDATE", PLUGIN_USER, "gpu-1", (OWN, OWN), "allow"),
        ("DELETE", PLUGIN_USER, "gpu-1", (None, OWN), "allow"),
        # another node's slice
        ("CREATE", PLUGIN_USER, "gpu-1", (OTHER_NODE, None), "spec.nodeName 'gpu-1', not 'gpu-2'"),
        ("UPDATE", PLUGIN_USER, "gpu-1", (OTHER_NODE, OTHER_NODE), "not 'gpu-2'"),
        ("DELETE", PLUGIN_USER, "gpu-1", (None, OTHER_NODE), "not 'gpu-2'"),
        # its own node name, but another node's pool (measured: it made that node's GPU
        # unschedulable)
        ("CREATE", PLUGIN_USER, "gpu-1", (OTHER_POOL, None), "of pool 'gpu-1', not 'gpu-2'"),
        ("UPDATE", PLUGIN_USER, "gpu-1", (OTHER_POOL, OWN), "of pool 'gpu-1', not 'gpu-2'"),
        ("DELETE", PLUGIN_USER, "gpu-1", (None, OTHER_POOL), "of pool 'gpu-1', not 'gpu-2'"),
        # another driver's devices
        ("CREATE", PLUGIN_USER, "gpu-1", (OTHER_DRIVER, None), "not 'gpu.nvidia.com'"),
        ("UPDATE", PLUGIN_USER, "gpu-1", (OTHER_DRIVER, OTHER_DRIVER), "not 'gpu.nvidia.com'"),
        ("DELETE", PLUGIN_USER, "gpu-1", (None, OTHER_DRIVER), "not 'gpu.nvidia.com'"),
        # an update may not take over a slice that was another node's
        ("UPDATE", PLUGIN_USER, "gpu-1", (OWN, OTHER_POOL), "already its node's ('gpu-1'"),
        ("UPDATE", PLUGIN_USER, "gpu-1", (OWN, OTHER_DRIVER), "already its node's ('gpu-1'"),
        # cluster-wide slices, and tokens without a node
        ("CREATE", PLUGIN_USER, "gpu-1", (CLUSTER_WIDE, None), "not ''"),
        ("CREATE", PLUGIN_USER, None, (OWN, None), "no node association"),
        # other users are not this policy's business
        ("CREATE", "system:serviceaccount:other:other", None, (OTHER_NODE, None), "skip"),
        ("DELETE", "system:node:gpu-1", None, (None, OTHER_NODE), "skip"),
    ],
)
def test_resourceslice_policy_decisions(
    operation: str,
    user: str,
    node: str | None,
    objects: tuple[JSON | None, JSON | None],
    verdict: str,
) -> None:
    got = _admit(operation, user, node, *objects)
    if verdict in {"allow", "skip"}:
        assert got == verdict
    else:
        assert verdict in got, got


OURS = "gpu.biaxial.dev/allocation"
BUILTIN = "resource.kubernetes.io/delete-protection"
TENANT = "system:serviceaccount:team-a:default"


def _claim(finalizers: list[str], driver: str | None = None, pods: tuple[str, ...] = ()) -> JSON:
    """A ResourceClaim as the policy sees it: allocated a device of ``driver`` (None: not
    allocated), reserved for ``pods``."""
    claim: JSON = {"metadata": {"namespace": "team-a", "name": "train"}}
    if finalizers:
        claim["metadata"]["finalizers"] = finalizers
    if driver is not None:
        result = {"request": "gpu", "driver": driver, "pool": "gpu-1", "device": "gpu-0"}
        claim["status"] = {"allocation": {"devices": {"results": [result]}}}
        if pods:
            claim["status"]["reservedFor"] = [
                {"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods
            ]
    return claim


NOTHING: list[str] = []


@pytest.mark.parametrize(
    ("new", "old", "verdict"),
    [
        # stripping the controller's finalizer while the claim runs a pod
        (_claim(NOTHING), _claim([OURS], "gpu.biaxial.dev", ("p0",)), "reserved for pod(s) p0:"),
        # ... or while merely allocated (what the controller never does)
        (_claim(NOTHING), _claim([OURS], "gpu.biaxial.dev"), "is still allocated: its finalizer"),
        (_claim(NOTHING), _claim([OURS], "other.dev"), f"its finalizer {OURS} keeps"),
        # many pods: the first three, then a count
        (
            _claim(NOTHING),
            _claim([OURS], "gpu.biaxial.dev", ("a", "b", "c", "d", "e")),
            "reserved for pod(s) a, b, c and 2 more:",
        ),
        # keeping ours while dropping another finalizer is the tenant's business
        (_claim([OURS]), _claim([OURS, "team-a/x"], "gpu.biaxial.dev", ("p0",)), "skip"),
        # the controller's own path: deallocated first, then the finalizer goes
        (_claim(NOTHING), _claim([OURS]), "allow"),
        # kube-scheduler's finalizer, while it holds this driver's devices only
        (_claim(NOTHING), _claim([BUILTIN], "gpu.biaxial.dev", ("p0",)), f"finalizer {BUILTIN}"),
        (_claim(NOTHING), _claim([BUILTIN], "other.dev", ("p0",)), "allow"),
        (_claim(NOTHING), _claim([BUILTIN]), "allow"),
        # adding a finalizer, or changing anything else, is not this policy's business
        (_claim([OURS]), _claim(NOTHING), "skip"),
        (_claim([OURS]), _claim([OURS], "gpu.biaxial.dev", ("p0",)), "skip"),
    ],
)
def test_claim_protection_policy_decisions(new: JSON, old: JSON, verdict: str) -> None:
    got = _admit("UPDATE", TENANT, None, new, old, policy_name="biaxial-claim-protection")
    if verdict in {"allow", "skip"}:
        assert got == verdict
    else:
        assert verdict in got, got
        assert "Delete the pods that use the claim" in got


def _marked(claim: JSON) -> JSON:
    claim["metadata"]["deletionTimestamp"] = "2026-12-06T16:00:00Z"
    return claim


@pytest.mark.parametrize(
    ("new", "old", "allocator", "verdict"),
    [
        # an allocator lets a claim marked for deletion go, allocated and reserved as it is
        (
            _marked(_claim(NOTHING)),
            _marked(_claim([OURS], "gpu.biaxial.dev", ("p0",))),
            True,
            "allow",
        ),
        (_marked(_claim(NOTHING)), _marked(_claim([BUILTIN], "gpu.biaxial.dev")), True, "allow"),
        # ... a tenant may not
        (
            _marked(_claim(NOTHING)),
            _marked(_claim([OURS], "gpu.biaxial.dev", ("p0",))),
            False,
            "reserved for pod(s) p0:",
        ),
        # ... nor an allocator from a claim not marked for deletion
        (
            _claim(NOTHING),
            _claim([OURS], "gpu.biaxial.dev", ("p0",)),
            True,
            "reserved for pod(s) p0:",
        ),
    ],
)
def test_claim_protection_lets_an_allocator_let_a_deleted_claim_go(
    new: JSON, old: JSON, allocator: bool, verdict: str
) -> None:
    got = _admit(
        "UPDATE",
        TENANT,
        None,
        new,
        old,
        policy_name="biaxial-claim-protection",
        allocator=allocator,
    )
    if verdict == "allow":
        assert got == "allow"
    else:
        assert verdict in got, got


# --------------------------------------------------------------------------- kind quick start


def test_kind_configs_and_script_match_the_fake_gpu_variant() -> None:
    kind = ROOT / "deploy" / "kind"
    old = yaml.safe_load((kind / "cluster-1.34.yaml").read_text(encoding="utf-8"))
    new = yaml.safe_load((kind / "cluster-1.36.yaml").read_text(encoding="utf-8"))
    assert old["featureGates"] == {
        "DRAConsumableCapacity": True,
        "DRAExtendedResource": True,
        "DRADeviceTaints": True,
        "DRAPartitionableDevices": True,
    }
    assert "featureGates" not in new  # everything biaxial uses is on by default from 1.36
    fake = VARIANTS["biaxial-fake-gpus.yaml"]["kubeletPlugin"]
    wanted_labels = {k: v for k, v in fake["nodeSelector"].items() if v is not None}
    for config in (old, new):
        assert config["kind"] == "Cluster"
        workers = [n for n in config["nodes"] if n["role"] == "worker"]
        assert len(workers) == 2
        assert all(wanted_labels.items() <= n["labels"].items() for n in workers)
    script = (kind / "up.sh").read_text(encoding="utf-8")
    assert f"kubeletPlugin.fakeGpus={fake['fakeGpus']}" in script
    assert "kubeletPlugin.advertiseLegacyResources=true" in script
    assert "deploy/manifests/biaxial-fake-gpus.yaml" in script
    for key, value in wanted_labels.items():
        assert f'"{key}":"{value}"' in script


def _merge(base: JSON, extra: Mapping[str, Any]) -> JSON:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def test_kind_script_helm_install_renders_the_fake_gpu_manifest() -> None:
    import shlex

    import helm_python as helm

    script = (ROOT / "deploy" / "kind" / "up.sh").read_text(encoding="utf-8")
    start = script.index("helm upgrade --install")
    command: list[str] = []
    for line in script[start:].splitlines():
        command.append(line.rstrip("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    words = shlex.split(" ".join(command))
    values: JSON = {}
    parsers = {"--set": helm.parse_set_string, "--set-json": helm.parse_set_json}
    for flag, expression in pairwise(words):
        if flag in parsers and "${" not in expression:  # image flags: the script's default
            values = _merge(values, parsers[flag](expression))
    assert values, words
    assert render(values) == render(VARIANTS["biaxial-fake-gpus.yaml"])


# --------------------------------------------------------------------------- HAMi-core

HAMI_LIBRARY = "/var/lib/biaxial/hami-core/libvgpu.so"


def _pod(objs: list[JSON]) -> JSON:
    spec: JSON = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def _install_container(objs: list[JSON]) -> list[JSON]:
    return [c for c in _pod(objs).get("initContainers", []) if c["name"] == "install-hami-core"]


def _dockerfile_args() -> dict[str, str]:
    lines = (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines()
    return dict(
        line.removeprefix("ARG ").split("=", 1)
        for line in lines
        if line.startswith("ARG ") and "=" in line
    )


def test_the_image_builds_hami_core_from_a_pinned_upstream_commit() -> None:
    import re

    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    args = _dockerfile_args()
    assert args["HAMI_CORE_REPOSITORY"] == "https://github.com/Project-HAMi/HAMi-core.git"
    assert re.fullmatch(r"[0-9a-f]{40}", args["HAMI_CORE_COMMIT"])
    assert args["HAMI_CORE"] == "build"
    assert args["CUDA_DEVEL_IMAGE"].startswith("nvidia/cuda:")
    assert "devel" in args["CUDA_DEVEL_IMAGE"]
    assert 'git checkout --detach "${HAMI_CORE_COMMIT}"' in text
    assert "bash ./build.sh" in text  # upstream's own build (cmake)
    assert "COPY --from=hami-core /out/ /opt/biaxial/hami-core/" in text
    # the docs name the same release and commit
    sharing = (ROOT / "docs" / "sharing.md").read_text(encoding="utf-8")
    assert args["HAMI_CORE_COMMIT"] in sharing
    assert f"HAMi {args['HAMI_CORE_VERSION']}" in sharing


def test_hami_core_is_installed_on_every_plugin_node_by_default() -> None:
    from biaxial.commands import kubelet_plugin
    from kubeletplugin.settings import DEFAULT_HAMI_CORE_LIBRARY, Settings

    objs = render()
    (init,) = _install_container(objs)
    plugin = container(objs, "DaemonSet")
    assert init["image"] == plugin["image"]
    assert {e["name"]: e["value"] for e in init["env"]} == {"HAMI_CORE_LIBRARY": HAMI_LIBRARY}
    assert "/opt/biaxial/hami-core/libvgpu.so" in init["args"][0]  # where the image has it
    assert init["securityContext"] == {
        "runAsUser": 0,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert init["volumeMounts"] == [
        {"name": "hami-core", "mountPath": "/var/lib/biaxial/hami-core"}
    ]
    volumes = {v["name"]: v["hostPath"] for v in _pod(objs)["volumes"]}
    assert volumes["hami-core"] == {
        "path": "/var/lib/biaxial/hami-core",
        "type": "DirectoryOrCreate",
    }
    # the plugin points containers at it and sees it read-only, to check it is there
    assert f"--hami-core-library={HAMI_LIBRARY}" in plugin["args"]
    (mount,) = [m for m in plugin["volumeMounts"] if m["name"] == "hami-core"]
    assert mount == {
        "name": "hami-core",
        "mountPath": "/var/lib/biaxial/hami-core",
        "readOnly": True,
    }
    # ... and the plugin finds it there by default without the chart too
    assert str(DEFAULT_HAMI_CORE_LIBRARY) == HAMI_LIBRARY
    assert Settings(node_name="n").hami_core_library_path == DEFAULT_HAMI_CORE_LIBRARY
    parser = build_parser()
    args = parser.parse_args(["kubelet-plugin", "--node-name", "n"])
    plugin_settings = kubelet_plugin.settings_from_args(args)
    assert plugin_settings.hami_core_library_path == DEFAULT_HAMI_CORE_LIBRARY


def test_hami_core_install_and_library_can_be_turned_off() -> None:
    from biaxial.commands import kubelet_plugin

    elsewhere = render({"kubeletPlugin": {"installHamiCore": False}})
    assert _install_container(elsewhere) == []  # installed another way: still used
    assert f"--hami-core-library={HAMI_LIBRARY}" in container(elsewhere, "DaemonSet")["args"]
    hami = render(
        {
            "kubeletPlugin": {
                "installHamiCore": False,
                "hamiCoreLibrary": "/usr/local/vgpu/libvgpu.so",
            }
        }
    )
    volumes = {v["name"]: v["hostPath"]["path"] for v in _pod(hami)["volumes"]}
    assert volumes["hami-core"] == "/usr/local/vgpu"
    off = render({"kubeletPlugin": {"hamiCoreLibrary": ""}})
    assert _install_container(off) == []
    assert "hami-core" not in {v["name"] for v in _pod(off)["volumes"]}
    args = container(off, "DaemonSet")["args"]
    assert "--hami-core-library=none" in args
    parsed = build_parser().parse_args([*args, "--node-name", "n"])
    assert kubelet_plugin.settings_from_args(parsed).hami_core_library_path is None


def test_the_install_script_replaces_the_library_atomically(tmp_path: Path) -> None:
    """Run the init container's script for real (paths moved under tmp_path): it installs,
    leaves an identical file alone, replaces a changed one by rename (a process holding the old
    file keeps its content), leaves no temporary file, and fails with a clear message when the
    image has no library."""
    import subprocess

    (init,) = _install_container(render())
    image = tmp_path / "image"
    image.mkdir()
    host = tmp_path / "host"
    host.mkdir()
    script = init["args"][0].replace("/opt/biaxial/hami-core", str(image))
    target = host / "libvgpu.so"

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/sh", "-c", script],
            env={"HAMI_CORE_LIBRARY": str(target), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=False,
        )

    (image / "libvgpu.so").write_bytes(b"first build")
    (image / "VERSION").write_text("HAMi-core test\n")
    first = run()
    assert first.returncode == 0, first.stderr
    assert f"installed {target}: HAMi-core test" in first.stdout
    assert target.read_bytes() == b"first build"
    inode = target.stat().st_ino
    again = run()
    assert again.returncode == 0
    assert "is up to date" in again.stdout
    assert target.stat().st_ino == inode
    with target.open("rb") as in_use:
        (image / "libvgpu.so").write_bytes(b"second build")
        assert run().returncode == 0
        assert in_use.read() == b"first build"  # a running container keeps its file
    assert target.read_bytes() == b"second build"
    assert target.stat().st_ino != inode
    assert sorted(p.name for p in host.iterdir()) == ["libvgpu.so"]
    (image / "libvgpu.so").unlink()
    missing = run()
    assert missing.returncode == 1
    assert "installHamiCore=false" in missing.stderr
    assert target.read_bytes() == b"second build"

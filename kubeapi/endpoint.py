"""Where the API server is and how to authenticate, resolved once at process start.

Two ways, one answer:

* **directly**, for what a controller and a kubelet plugin meet in production and in tests:
  the in-cluster service account (``KUBERNETES_SERVICE_HOST``/``_PORT``, the token file, which
  the client re-reads because projected tokens rotate, and the cluster CA), and a kubeconfig
  whose current context names a cluster with only ``server`` and its CA
  (``certificate-authority`` or ``-data``, or ``insecure-skip-tls-verify``) and a user with at
  most an inline ``token``;
* **through the official** ``kubernetes`` **package** for everything else (exec plugins,
  auth providers, token files, client certificates, basic auth, merged ``$KUBECONFIG`` lists):
  it is imported only then, because it costs ~0.2 s of start-up CPU and ~20 MB.

The direct way gives exactly what the package gives (the unit tests compare the two on every
shape it takes); anything it does not recognise goes to the package, which also words the
errors. Settings the API client cannot honour (``tls-server-name``, ``proxy-url``) are
refused, never ignored. A file or configuration that cannot be loaded is a
:class:`~driver.api.errors.ConfigError` with a one-line message.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from driver.api.errors import ConfigError

#: Where a pod's service account is mounted (the in-cluster configuration).
SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_TOP_KEYS: Final = frozenset(
    {"apiVersion", "kind", "clusters", "contexts", "users", "current-context", "preferences"}
)
_CONTEXT_KEYS: Final = frozenset({"cluster", "user", "namespace"})
_CLUSTER_KEYS: Final = frozenset(
    {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
)
_USER_KEYS: Final = frozenset({"token"})


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The API server's URL, the headers that authenticate, the TLS context."""

    host: str
    headers: Mapping[str, str]
    ssl_context: ssl.SSLContext | None
    token_file: Path | None = None  # re-read by the client: projected tokens rotate

    @classmethod
    def resolve(cls, kubeconfig: str | Path | None, *, local_fallback: bool = False) -> Endpoint:
        """The ``kubeconfig`` file; without one, the in-cluster service account, and outside
        a pod with ``local_fallback`` the default kubeconfig (``$KUBECONFIG`` or
        ``~/.kube/config``)."""
        direct = _in_cluster() if kubeconfig is None else _plain_kubeconfig(Path(kubeconfig))
        if direct is not None:
            return direct
        return _loaded(kubeconfig, local_fallback=local_fallback)


def _tls(
    cafile: str | None = None, cadata: str | None = None, verify: bool = True
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=cafile, cadata=cadata)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _in_cluster() -> Endpoint | None:
    """The service account's endpoint, as the package's in-cluster loader resolves it (None
    when something is missing: the package then says what, or tries a kubeconfig)."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    token, ca = SERVICE_ACCOUNT / "token", SERVICE_ACCOUNT / "ca.crt"
    try:
        if not (host and port and token.read_text() and ca.read_text()):
            return None
    except OSError:
        return None
    hostport = f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"
    return Endpoint(
        host=f"https://{hostport}", headers={}, ssl_context=_tls(str(ca)), token_file=token
    )


def _named(entries: Any, name: Any, key: str) -> Mapping[str, Any] | None:
    """The ``key`` mapping of the entry called ``name`` in a kubeconfig list (None: absent
    or not the plain shape)."""
    if not isinstance(entries, list) or not isinstance(name, str) or not name:
        return None
    found = [e for e in entries if isinstance(e, Mapping) and e.get("name") == name]
    if len(found) != 1 or set(found[0]) - {"name", key}:
        return None
    value = found[0].get(key)
    return value if isinstance(value, Mapping) else None


def _plain_kubeconfig(path: Path) -> Endpoint | None:
    """A kubeconfig of the plain shape (module docstring) resolved directly; None for any
    other shape, or anything unreadable (the package then reads it, or words the error)."""
    import yaml  # noqa: PLC0415 - only where a kubeconfig is read

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(doc, Mapping) or set(doc) - _TOP_KEYS:
        return None
    context = _named(doc.get("contexts"), doc.get("current-context"), "context")
    if context is None or set(context) - _CONTEXT_KEYS:
        return None
    cluster = _named(doc.get("clusters"), context.get("cluster"), "cluster")
    if (
        cluster is None
        or set(cluster) - _CLUSTER_KEYS
        or not isinstance(cluster.get("server"), str)
    ):
        return None
    user: Mapping[str, Any] = {}
    if context.get("user"):
        named = _named(doc.get("users"), context["user"], "user")
        if named is None and doc.get("users"):
            return None  # (the package treats a user it cannot find as none: let it)
        user = named or {}
    if set(user) - _USER_KEYS:
        return None
    headers: dict[str, str] = {}
    if "token" in user:
        if not isinstance(user["token"], str) or not user["token"]:
            return None
        headers["Authorization"] = f"Bearer {user['token']}"
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        return None
    host = cluster["server"].rstrip("/")
    if not host.startswith("https"):
        return Endpoint(host=host, headers=headers, ssl_context=None)
    # The package's path rules: relative to the kubeconfig's folder, normalised lexically
    # (normpath, not Path.resolve, which would follow symlinks).
    base = os.path.dirname(os.path.abspath(path))  # noqa: PTH100, PTH120
    try:
        if "certificate-authority-data" in cluster:
            pem = base64.standard_b64decode(str(cluster["certificate-authority-data"]))
            if not pem.lstrip().startswith(b"-----BEGIN"):
                return None
            ctx = _tls(cadata=pem.decode("ascii"), verify=not insecure)
        elif "certificate-authority" in cluster:
            ca = os.path.normpath(os.path.join(base, str(cluster["certificate-authority"])))  # noqa: PTH118
            ctx = _tls(cafile=ca, verify=not insecure)
        else:
            ctx = _tls(verify=not insecure)
    except (OSError, ValueError, binascii.Error, ssl.SSLError):
        return None
    return Endpoint(host=host, headers=headers, ssl_context=ctx)


def _loaded(kubeconfig: str | Path | None, *, local_fallback: bool) -> Endpoint:
    """The endpoint as the official package resolves it (module docstring)."""
    import yaml  # noqa: PLC0415 - the kubeconfig loader's parser
    from kubernetes import client, config  # noqa: PLC0415 - heavy; process start only
    from kubernetes.config.incluster_config import (  # noqa: PLC0415
        SERVICE_TOKEN_FILENAME,
    )

    cfg = client.Configuration()
    token_file: Path | None = None
    where = (
        str(kubeconfig)
        if kubeconfig is not None
        else (
            "the in-cluster configuration or the default kubeconfig (no --kubeconfig given)"
            if local_fallback
            else "the in-cluster configuration (no --kubeconfig given)"
        )
    )
    try:
        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                token_file = Path(SERVICE_TOKEN_FILENAME)
            except config.ConfigException:
                if not local_fallback:
                    raise
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    client_configuration=cfg, persist_config=False
                )
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig), client_configuration=cfg, persist_config=False
            )
        # Token, token file, exec plugin, auth provider and basic auth all land here ("Bearer
        # ...", "Basic ..."); the in-cluster token is re-read from its file by the client.
        credential = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    except (
        config.ConfigException,
        yaml.YAMLError,
        OSError,
        ValueError,
        TypeError,
        KeyError,
    ) as exc:
        detail = " ".join(str(exc).split())  # YAML errors span lines; errors are one line
        raise ConfigError(f"cannot load Kubernetes config from {where}: {detail}") from exc
    for setting, value in (("tls-server-name", cfg.tls_server_name), ("proxy-url", cfg.proxy)):
        if value:
            raise ConfigError(
                f"cannot use the Kubernetes config from {where}: its cluster sets {setting} "
                f"({value}), which biaxial's API client does not support"
            )
    headers: dict[str, str] = {}
    if credential and token_file is None:
        headers["Authorization"] = str(credential)
    host = str(cfg.host).rstrip("/")
    ctx: ssl.SSLContext | None = None
    if host.startswith("https://"):
        ctx = _tls(cfg.ssl_ca_cert or None, verify=bool(cfg.verify_ssl))
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return Endpoint(host=host, headers=headers, ssl_context=ctx, token_file=token_file)

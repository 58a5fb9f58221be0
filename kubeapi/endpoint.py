"""Where the API server is and how to authenticate, resolved once at process start.

The official ``kubernetes`` package is used only here, and only to *resolve* a kubeconfig
(contexts, certificates, tokens; exec-plugin tokens are fetched once) or the in-cluster
service account; it is imported lazily because it is heavy. A file or configuration that
cannot be loaded is a :class:`~driver.api.errors.ConfigError` with a one-line message.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from driver.api.errors import ConfigError


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
        import yaml  # noqa: PLC0415 - the kubeconfig loader's parser
        from kubernetes import client, config  # noqa: PLC0415 - heavy; process start only
        from kubernetes.config.incluster_config import (  # noqa: PLC0415
            SERVICE_TOKEN_FILENAME,
        )

        cfg = client.Configuration()
        token_file: Path | None = None
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
        except (
            config.ConfigException,
            yaml.YAMLError,
            OSError,
            ValueError,
            TypeError,
            KeyError,
        ) as exc:
            where = kubeconfig or (
                "the in-cluster configuration or the default kubeconfig (no --kubeconfig given)"
                if local_fallback
                else "the in-cluster configuration (no --kubeconfig given)"
            )
            detail = " ".join(str(exc).split())  # YAML errors span lines; errors are one line
            raise ConfigError(f"cannot load Kubernetes config from {where}: {detail}") from exc
        headers: dict[str, str] = {}
        token = cfg.get_api_key_with_prefix("authorization")
        if token:
            headers["Authorization"] = str(token)
        elif cfg.username and cfg.password:
            headers["Authorization"] = str(cfg.get_basic_auth_token())
        host = str(cfg.host).rstrip("/")
        ctx: ssl.SSLContext | None = None
        if host.startswith("https://"):
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
            if not cfg.verify_ssl:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        return cls(host=host, headers=headers, ssl_context=ctx, token_file=token_file)

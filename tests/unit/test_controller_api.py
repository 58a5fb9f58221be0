"""The controller's API client (controller.api.KubeApi): what it adds to :class:`kubeapi.Client`
(binding a pod to a node, its user agent). The client itself is tested in test_kubeapi.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from controller.api import KubeApi
from tests.unit.local_api import with_server


def test_bind_posts_a_binding_with_the_controller_user_agent() -> None:
    seen: list[tuple[str, str, str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        seen.append((request.method, request.path, request.headers["User-Agent"], body))
        return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)

    async def scenario(api: KubeApi) -> None:
        await api.bind("default", "p0", "uid-0", "n1")

    asyncio.run(with_server(handler, scenario, KubeApi))
    ((method, path, agent, body),) = seen
    assert (method, path, agent) == (
        "POST",
        "/api/v1/namespaces/default/pods/p0/binding",
        "biaxial-controller",
    )
    assert body["metadata"] == {"name": "p0", "namespace": "default", "uid": "uid-0"}
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}

"""A tiny local HTTP server standing in for the API server, for tests of the raw-JSON clients
(:class:`kubeapi.Client` and the components' subclasses): one handler answers every path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from kubeapi import Client, Endpoint

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
C = TypeVar("C", bound=Client)


async def with_server(
    handler: Handler,
    scenario: Callable[[C], Awaitable[Any]],
    client_type: type[C],
    *,
    token_file: Path | None = None,
) -> Any:
    """Serve ``handler`` on a free port, run ``scenario`` with a ``client_type`` pointed at it
    (no rate limit to speak of), shut the server down."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    endpoint = Endpoint(
        host=f"http://127.0.0.1:{port}", headers={}, ssl_context=None, token_file=token_file
    )
    try:
        async with client_type(endpoint, qps=1000, burst=1000) as client:
            return await scenario(client)
    finally:
        await runner.cleanup()

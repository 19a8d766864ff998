"""HTTP ``/server_info`` route surgery, in the engine process of a launching HTTP server.

FastAPI bound the route function when ``sglang.srt.entrypoints.http_server`` was imported,
before any hook could run, so a hook cannot reach it: the route itself is replaced, as the
launch starts (the app serves only after the launch), by one that passes upstream's body
through a transform of the adapter's choosing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
SERVER_INFO_PATH = "/server_info"

Transform = Callable[[Mapping[str, Any]], dict[str, Any]]


def rebind_loaded_server_info_route(transform: Transform) -> None:
    """Rebind ``/server_info`` when ``http_server.launch_server`` is launching (module loaded).

    Called as the launch starts: the app serves only after the launch.
    """
    http_server = sys.modules.get(HTTP_SERVER_MODULE)
    if http_server is not None:
        rebind_server_info_route(http_server, transform)


def rebind_server_info_route(http_server: Any, transform: Transform) -> None:
    """Point ``/server_info`` (and the deprecated alias) at ``transform(upstream body)``.

    Idempotent.
    """
    from fastapi.routing import APIRoute

    routes = http_server.app.router.routes
    for index, route in enumerate(routes):
        if not isinstance(route, APIRoute) or route.path != SERVER_INFO_PATH:
            continue
        if getattr(route.endpoint, "_sidecar_overlay", False):
            return
        server_info = _transformed_endpoint(route.endpoint, transform)
        routes[index] = APIRoute(
            route.path, server_info, methods=list(route.methods or ["GET"]), name=route.name
        )
        # The deprecated /get_server_info calls the module-level name.
        http_server.server_info = server_info
        return


def _transformed_endpoint(upstream: Any, transform: Transform) -> Any:
    async def server_info() -> dict[str, Any]:
        return transform(await upstream())

    server_info._sidecar_overlay = True  # type: ignore[attr-defined]
    server_info.__doc__ = upstream.__doc__
    return server_info

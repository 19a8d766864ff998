"""Calls to a Dynamo endpoint through Dynamo's own runtime client.

Standard library and Dynamo only, so any consumer version's environment runs it (the SGLang
env's own Dynamo, or another version's env of its own, through ``inside.run(python=...)``).
Discovery is the environment's (file here, etcd under ``make slurm``); requests over TCP,
events over ZMQ.
"""

from __future__ import annotations

from typing import Any


def discovery_backend() -> str:
    """The environment's discovery backend (``DYN_DISCOVERY_BACKEND``, as Dynamo's own
    processes read it), file discovery when unset."""
    import os

    return os.environ.get("DYN_DISCOVERY_BACKEND", "file")


def call(endpoint: str, payload: Any, seconds: float = 60.0) -> list:
    """Every response of one call to ``endpoint`` (``namespace.component.endpoint``)."""
    import asyncio

    from dynamo.runtime import DistributedRuntime

    async def responses() -> list:
        loop = asyncio.get_running_loop()
        runtime = DistributedRuntime(loop, discovery_backend(), "tcp", event_plane="zmq")
        try:
            client = await runtime.endpoint(endpoint).client()
            await asyncio.wait_for(client.wait_for_instances(), seconds)
            stream = await client.round_robin(payload)
            return [item.data() if hasattr(item, "data") else item async for item in stream]
        finally:
            runtime.shutdown()

    return asyncio.run(asyncio.wait_for(responses(), seconds))


def call_every(endpoint: str, payload: Any, instances: int, seconds: float = 60.0) -> list[list]:
    """Every response of one call to each of ``instances`` instances of ``endpoint`` (several
    processes serving the same endpoint), once that many are registered: one list per
    instance, in instance-id order."""
    import asyncio

    from dynamo.runtime import DistributedRuntime

    async def responses() -> list[list]:
        loop = asyncio.get_running_loop()
        runtime = DistributedRuntime(loop, discovery_backend(), "tcp", event_plane="zmq")
        try:
            client = await runtime.endpoint(endpoint).client()
            while len(client.instance_ids()) < instances:
                await asyncio.sleep(0.2)
            replies = []
            for instance in sorted(client.instance_ids()):
                stream = await client.direct(payload, instance)
                replies.append([item.data() if hasattr(item, "data") else item
                                async for item in stream])  # fmt: skip
            return replies
        finally:
            runtime.shutdown()

    return asyncio.run(asyncio.wait_for(responses(), seconds))

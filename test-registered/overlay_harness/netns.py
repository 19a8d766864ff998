"""Nodes as hosts: one network namespace per node on a private bridge the test creates.

Each node of a multi-node engine group gets its own network namespace with loopback up and one
interface (``eth0``) on a bridge in the root namespace, addressed from 192.0.2.0/24 (TEST-NET-1,
a documentation range). The bridge has no address and the namespaces have no default route, so
nothing is routed off the machine and the root namespace (the test process) cannot reach a
node: every consumer and probe of such a node runs inside it (``Host.command``, i.e.
``ip netns exec``).

Names carry a prefix and the creating process id, so a later run removes what an aborted run
left behind (its process is gone) and parallel runs never touch each other's: the sweep and
the creation of a network hold one lock (``LOCK_PATH``), so a sweep never sees a bridge whose
namespaces do not exist yet. Creating
namespaces needs root (CAP_NET_ADMIN); when that fails the caller gets an ``AssertionError``
with the reason: the tier fails, it does not skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

PREFIX = "ovh"  # namespaces ovh-<pid>-<run>-<index>; bridge ovb<run>; veths ovv<run><index>
BRIDGE_PREFIX, VETH_PREFIX = "ovb", "ovv"
SUBNET = "192.0.2"
PREFIX_LEN = 24
FIRST_HOST = 10  # node i is 192.0.2.(10 + i)
NODE_INTERFACE = "eth0"  # a node's one interface on the bridge
LOCK_PATH = os.path.join(tempfile.gettempdir(), "sglang-overlay-harness-netns.lock")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise AssertionError(
            "nodes run in their own network namespaces: the `ip` command (iproute2) is missing"
        ) from exc
    if check and proc.returncode != 0:
        raise AssertionError(
            f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}; nodes "
            "run in their own network namespaces, which needs root (CAP_NET_ADMIN)"
        )
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _sweep_lock() -> Iterator[None]:
    """Held while sweeping stale names and while creating a network, by every test process."""
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def remove_stale() -> list[str]:
    """Delete this harness' namespaces, bridges and veths whose creating process is gone."""
    removed, live_runs = [], set()
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        if _pid_alive(int(parts[1])):
            live_runs.add(parts[2])
            continue
        _ip("netns", "delete", name, check=False)
        removed.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        if len(fields) < 2:
            continue
        link = fields[1].strip().split("@")[0]
        if link[:3] in (BRIDGE_PREFIX, VETH_PREFIX) and link[3:9] not in live_runs:
            _ip("link", "delete", link, check=False)
            removed.append(link)
    return removed


class Host:
    """One node's namespace: its name and its address on the bridge."""

    def __init__(self, netns: str, address: str) -> None:
        self.netns = netns
        self.address = address

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec`` execs, no fork)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def node_command(self, argv: list[str]) -> list[str]:
        """``argv`` as this host's node: its namespace and a ``/dev/shm`` of its own.

        Separate machines share no memory, and SGLang decides which ranks of a process group
        are on one node by opening a shared-memory segment the other rank created: with one
        ``/dev/shm`` for every node, it takes the other node's ranks for local ones and waits
        for them on its own loopback. ``ip netns exec`` already runs ``argv`` in a mount
        namespace of its own, so the tmpfs mounted there is this node's alone and goes away
        with its last process.
        """
        private_shm = 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"'
        return self.command(["sh", "-c", private_shm, "sh", *argv])

    def __repr__(self) -> str:
        return f"Host({self.netns}, {self.address})"


class Network:
    """A private bridge and ``count`` hosts on it, created for its first user
    (``acquire``) and removed after its last (``release``)."""

    def __init__(self, count: int) -> None:
        self.run = uuid.uuid4().hex[:6]
        self.bridge = f"{BRIDGE_PREFIX}{self.run}"
        self.hosts = [
            Host(f"{PREFIX}-{os.getpid()}-{self.run}-{index}", f"{SUBNET}.{FIRST_HOST + index}")
            for index in range(count)
        ]
        self._created: list[str] = []
        self._bridge_created = False
        self._users = 0

    def acquire(self) -> None:
        if self._users == 0:
            self._open()
        self._users += 1

    def release(self) -> None:
        self._users = max(0, self._users - 1)
        if self._users == 0:
            self._close()

    def _veth(self, index: int) -> str:
        return f"{VETH_PREFIX}{self.run}{index}"

    def _open(self) -> None:
        with _sweep_lock():
            remove_stale()
            self._create()

    def _create(self) -> None:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._bridge_created = True
            _ip("link", "set", self.bridge, "up")
            for index, host in enumerate(self.hosts):
                outer = self._veth(index)
                _ip("netns", "add", host.netns)
                self._created.append(host.netns)
                _ip("link", "add", outer, "type", "veth", "peer", "name", f"{outer}p")
                _ip("link", "set", f"{outer}p", "netns", host.netns)
                _ip("link", "set", outer, "master", self.bridge)
                _ip("link", "set", outer, "up")
                inside = ["-n", host.netns]
                _ip(*inside, "link", "set", "lo", "up")
                _ip(*inside, "link", "set", f"{outer}p", "name", NODE_INTERFACE)
                _ip(*inside, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", NODE_INTERFACE)
                _ip(*inside, "link", "set", NODE_INTERFACE, "up")
        except BaseException:
            self._close()
            raise

    def _close(self) -> None:
        """Delete the namespaces (their veth ends go with them) and the bridge."""
        for index, name in enumerate(self._created):
            _ip("netns", "delete", name, check=False)
            # The kernel removes the outer veth end with the namespace, asynchronously.
            _ip("link", "delete", self._veth(index), check=False)
        self._created.clear()
        if self._bridge_created:
            _ip("link", "delete", self.bridge, check=False)
            self._bridge_created = False

"""Assertions on what nodes of an engine group serve, shared by the classes that launch them."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import jsonschema
from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.contract import schema
from sglang_sidecar_overlay.sidecar import proctree

from overlay_harness import differences, kv_events, nodes, probes
from overlay_harness.group import KV_TOPIC, PAGE_SIZE, EngineGroup
from overlay_harness.nodes import Node

LEADER_REPLY_BUILT = "leader GetServerInfo reply built"


class NodeInfoChecks:
    """Mixed into a ``NodesTestCase`` (its ``assert*`` methods): checks of one node's
    ``GetServerInfo`` and of the node-locality of what a group advertises."""

    def assert_node_info(self, info: dict, group: EngineGroup, node_rank: int, ranks: list[int]):
        jsonschema.validate(info, schema.load_schema())
        self.assertEqual(info["node_rank"], node_rank)
        self.assertEqual(info["nnodes"], group.nnodes)
        sources = info["kv_event_sources"]
        self.assertEqual([s["dp_rank"] for s in sources], ranks, sources)
        for source in sources:
            # Real rank selection: the publisher of rank r binds base + r, on loopback.
            expected = f"tcp://127.0.0.1:{group.kv_base + source['dp_rank']}"
            self.assertEqual(source["endpoint"], expected)
            self.assertEqual(source["topic"], KV_TOPIC)
            # page_size x dcp_size (DCP 1 here): what the events carry, checked against them
            # in the tests that receive real events.
            self.assertEqual(source["block_size"], PAGE_SIZE)
        self.assertEqual(info["kv_event_rank_space"]["local_ranks"], ranks)

    def assert_reply_built_once(self, leader: Node, info: dict):
        """The leader's reply is built at the first GetServerInfo, then served as cached text:
        later calls get the same object, and the build is logged once per launch (the series
        builds it per call and has no such line, ``patches/DIFFERENCES.md`` #2)."""
        self.assertEqual([leader.server_info() for _ in range(3)], [info] * 3)
        if not differences.differs(differences.PLUGIN_LOG_LINES):
            self.assertEqual(leader.log_text().count(LEADER_REPLY_BUILT), 1, leader.log_tail())

    def assert_group_sources(self, started: list[Node], infos: list[dict]):
        """Distinct ranks and endpoints across the group; each advertised loopback endpoint
        delivers a live batch of a real request on its own node, and only there: a consumer on
        another node of the group cannot reach it. ``started[0]`` is the leader."""
        sources = [s for info in infos for s in info["kv_event_sources"]]
        self.assertEqual(len({s["dp_rank"] for s in sources}), len(sources))
        self.assertEqual(len({s["endpoint"] for s in sources}), len(sources))
        for owner, info in zip(started, infos, strict=True):
            for source in info["kv_event_sources"]:
                endpoint = source["endpoint"]
                _seq, payload = kv_events.receive_live_batch(owner, source, started[0])
                self.assertEqual(kv_events.decode(payload).attn_dp_rank, source["dp_rank"])
                for other in started:
                    if other is not owner:
                        refused = other.inside(probes.tcp_connect_error, endpoint)
                        self.assertIsNotNone(refused, f"{other.name} reached {endpoint}")
                        print(f"{endpoint} of {owner.name}: from {other.name} {refused}")

    def assert_follower_lifecycle(self, node: Node) -> tuple[list[int], float]:
        """SERVING while the schedulers live; NOT_SERVING then closed once they are gone
        (kills the node's schedulers); (the schedulers killed, when)."""
        if differences.differs(differences.FOLLOWER_HEALTH):
            # Upstream's follower server answers GetServerInfo but serves no health service.
            self.assertEqual(node.health_or_error(), "UNIMPLEMENTED")
            return kill_schedulers(node), time.monotonic()
        self.assertEqual(node.health(), nodes.SERVING)
        watch = node.watch_health()
        try:
            # The watch is live before the kill: its first status cannot race the watcher.
            self.assertEqual(watch.first_status(), nodes.SERVING)
            killed = kill_schedulers(node)
            killed_at = time.monotonic()
            seen = watch.statuses_until(nodes.NOT_SERVING)
        finally:
            watch.close()
        self.assertEqual(seen[0], nodes.SERVING)
        self.assertEqual(seen[-1], nodes.NOT_SERVING)
        nodes.wait_for(lambda: node.health() is None, 60, "the server to stop")
        return killed, killed_at


def report_fault(fault: str, outcome: str, seconds: float) -> None:
    """One row of ``docs/security.md``'s fault table: the fault, how the node ended, and the
    time from the fault to a node with no process left."""
    release = releases.installed_sglang_version() or ""
    sys.stderr.write(f"[{release}] fault table: {fault} | {outcome} | clean in {seconds:.2f} s\n")


def memory_kib(pids: list[int]) -> tuple[int, int]:
    """(RSS, PSS) in KiB summed over ``pids`` (shared pages counted once in PSS)."""
    rss = pss = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        for line in rollup:
            name, _, value = line.partition(":")
            if name in ("Rss", "Pss"):
                kib = int(value.split()[0])
                rss, pss = (rss + kib, pss) if name == "Rss" else (rss, pss + kib)
    return rss, pss


def report_launch(topology: str, started: list[Node], began: float) -> str:
    """One row of ``docs/compatibility.md``'s launch table, on stderr: the time from the first
    node's start to every node ready, and the group's memory once ready. Returns those two."""
    tagged = [pid for node in started for pid in nodes.pids_with_tag(node.tag)]
    rss, pss = memory_kib(nodes.pids_of_tree(tagged))
    release = releases.installed_sglang_version() or ""
    figures = (f"ready in {time.monotonic() - began:.1f} s | RSS {rss / 2**20:.2f} GiB, "
               f"PSS {pss / 2**20:.2f} GiB")  # fmt: skip
    sys.stderr.write(f"[{release}] launch table: {topology} | {len(started)} node(s) | {figures}\n")
    return figures


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    stat = proctree.read_stat(pid)
    return stat is not None and stat.state != "Z"


def spawned_children(pid: int) -> list[int]:
    """Live child processes of ``pid`` other than ``multiprocessing``'s resource tracker (on a
    follower: its schedulers). Not by ``spawn_main`` in the command line: on 0.5.19 a
    scheduler's process title replaces it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = proctree.read_stat(int(entry.name))
        if stat is None or stat.ppid != pid or stat.state == "Z":
            continue
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def kill_schedulers(node: Node) -> list[int]:
    """SIGKILL the node's schedulers: the child processes it reported ready with, or, for a
    node without a ready event (``blocking-follower``), its spawned children; their pids."""
    pids = node.event["pids"] if node.event is not None else spawned_children(node.proc.pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids

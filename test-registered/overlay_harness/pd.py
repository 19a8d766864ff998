"""Prefill/decode disaggregation: the launch arguments a PD pair runs with on the CPU, a minimal
PD router, what a prefill's metrics say, and the KV digests the CPU platform logs.

A PD router sends each request to a prefill and a decode server at once, the same body on both
plus ``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` (the prefill server's
bootstrap address and a room number naming the transfer), and answers with the decode's reply:
the decode server pulls the prompt's KV pages from the prefill over the transfer backend and
generates the rest. That is all SGLang's own PD router does per request, so the harness does it
here; :func:`route` runs on a host that reaches both servers (``Node.inside``).

The prefill's transferred bytes come from SGLang's own Prometheus histogram
``sglang:kv_transfer_total_mb`` (bytes / 2**20 per request) on its ``/metrics``
(``--enable-metrics``): :func:`transferred_bytes` sums it over every scheduler.
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from overlay_harness.nodes import Node

TRANSFER_METRIC = "sglang:kv_transfer_total_mb"
MIB = 1024 * 1024
BACKEND = "mooncake_tcp"
# What both roles of a PD pair run with on the CPU (docs/compatibility.md): the real transfer
# over Mooncake's TCP transport, and the KV checksum each side digests and the platform logs.
TRANSFER_ARGS = ["--disaggregation-transfer-backend", BACKEND,
                 "--disaggregation-enable-kv-checksum"]  # fmt: skip
# The prefill's cached-prefix path records a CUDA event under the overlap scheduler.
PREFILL_ARGS = ["--disaggregation-mode", "prefill", "--disable-overlap-schedule"]
# The default host pool pins memory; the radix cache makes the decode publish KV events.
DECODE_ARGS = ["--disaggregation-mode", "decode",
               "--disaggregation-decode-retraction-backup", "cpu_tensor",
               "--disaggregation-decode-enable-radix-cache"]  # fmt: skip
CHECKSUM = re.compile(r"overlay CPU test platform: KV checksum (0x[0-9a-f]+) over (\d+) pages")


def missing_piece() -> str | None:
    """What this env lacks for a real PD transfer on the CPU, or None."""
    try:
        from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES
    except ImportError:
        DISAGG_TRANSFER_BACKEND_CHOICES = ()
    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        return f"this SGLang has no --disaggregation-transfer-backend {BACKEND}"
    if importlib.util.find_spec("mooncake") is None:
        return "Mooncake's CPU build (mooncake-transfer-engine-non-cuda) is not in this env"
    if importlib.util.find_spec("sglang.srt.disaggregation.checksum") is None:
        return "this SGLang has no --disaggregation-enable-kv-checksum"
    return None


def checksums(log_text: str) -> list[str]:
    """Every KV digest the CPU platform logged in a node's log, in order."""
    return [match.group(1) for match in CHECKSUM.finditer(log_text)]


def page_counts(log_text: str) -> list[int]:
    """The pages of every KV digest the CPU platform logged in a node's log, in order."""
    return [int(match.group(2)) for match in CHECKSUM.finditer(log_text)]


def node_digests(node: Node) -> list[tuple[str, int]]:
    """(digest, pages) of every KV checksum the CPU platform logged on ``node``, in order."""
    text = node.log_text()
    return list(zip(checksums(text), page_counts(text), strict=True))


def digest_counts(nodes: list[Node]) -> list[int]:
    """How many KV checksums each of ``nodes`` logged so far."""
    return [len(node_digests(node)) for node in nodes]


def digests_since(nodes: list[Node], before: list[int]) -> list[tuple[str, int]]:
    """The (digest, pages) each of ``nodes`` logged after its first ``before`` ones, node after
    node (a per-node count: the nodes log their warm-ups' digests too)."""
    return [pair for node, count in zip(nodes, before, strict=True)
            for pair in node_digests(node)[count:]]  # fmt: skip


def _post(url: str, body: dict, seconds: float) -> dict:
    """``{"meta_info": ...}`` of a ``POST``, or ``{"error": ...}``."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=seconds) as reply:
            return {"meta_info": json.loads(reply.read())["meta_info"]}
    except urllib.error.HTTPError as exc:
        return {"error": f"{exc.code} {exc.read()[:2000].decode(errors='replace')}"}
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def failed(reply: dict) -> bool:
    """Whether a reply of :func:`_post` is a failed request (an HTTP error, or an abort)."""
    if "error" in reply:
        return True
    return (reply["meta_info"].get("finish_reason") or {}).get("type") == "abort"


def route(
    prefill: list,
    decode: list,
    bootstrap_port: int,
    requests: list,
    max_new_tokens: int,
    seconds: float,
    parallel: int = 4,
) -> list[dict]:
    """Each ``[room, input_ids]`` of ``requests`` through the PD pair (``prefill`` and
    ``decode`` are ``[host, http port]``), up to ``parallel`` at once; per request
    ``{"room", "prefill": reply, "decode": reply}``, each reply as :func:`_post`'s.

    As a PD router does, a request whose prefill fails fails at once: its decode side (which
    would wait for KV that never comes, until SGLang's waiting timeout) is not waited for."""
    prefill_url = f"http://{prefill[0]}:{prefill[1]}/generate"
    decode_url = f"http://{decode[0]}:{decode[1]}/generate"

    def one(room: int, input_ids: list[int]) -> dict:
        body = {
            "input_ids": input_ids,
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
            },
            "bootstrap_host": prefill[0],
            "bootstrap_port": bootstrap_port,
            "bootstrap_room": room,
        }
        to_decode: dict = {}
        # A daemon thread: an abandoned decode request never holds this process open.
        waiter = threading.Thread(
            target=lambda: to_decode.update(_post(decode_url, body, seconds)), daemon=True
        )
        waiter.start()
        to_prefill = _post(prefill_url, body, seconds)
        if failed(to_prefill):
            return {"room": room, "prefill": to_prefill,
                    "decode": {"error": "not awaited: the prefill failed"}}  # fmt: skip
        waiter.join(seconds)
        return {"room": room, "prefill": to_prefill,
                "decode": dict(to_decode) or {"error": f"no reply in {seconds:.0f} s"}}  # fmt: skip

    with ThreadPoolExecutor(parallel) as pairs:
        futures = [pairs.submit(one, room, ids) for room, ids in requests]
        return [future.result() for future in futures]


def histogram_sum(metrics_text: str, name: str) -> tuple[float, float]:
    """``(sum, count)`` of Prometheus histogram ``name`` over all its label sets."""
    total = count = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        base = metric.split("{", 1)[0]
        if base == f"{name}_sum":
            total += float(value)
        elif base == f"{name}_count":
            count += float(value)
    return total, count


def transferred_bytes(metrics_text: str) -> tuple[int, int]:
    """``(bytes, transfers)`` the prefill's ``/metrics`` reports having sent."""
    total_mb, count = histogram_sum(metrics_text, TRANSFER_METRIC)
    return round(total_mb * MIB), int(count)


def digests_only_sent_pages() -> bool:
    """Whether this SGLang's KV checksum covers only the pages the prefill sends, past the
    prefix the decode already holds (0.5.23); 0.5.21's covers the whole prompt, though only the
    pages past that prefix are sent."""
    import inspect

    from sglang.srt.disaggregation.checksum import page_indices_for_request

    return "start_idx" in inspect.signature(page_indices_for_request).parameters


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 4) -> int:
    """K and V of one token over every layer, for an MHA model's ``config.json``."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * heads * head_dim * dtype_bytes

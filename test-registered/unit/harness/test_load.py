"""The fault table's steady load (``overlay_harness.load``) against a real HTTP server on
loopback that answers as Dynamo's frontend does, fails on demand, or never answers: every
request ends, a silent one as hung at the bound, and the load stops when told."""

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator

from overlay_harness import load, ports
from overlay_harness.nodes import wait_for

WORKER = 7
BOUND = 2.0


class Frontend(http.server.ThreadingHTTPServer):
    """Answers ``POST /v1/completions`` like Dynamo's frontend, in the mode ``mode`` says:
    ``serve``, ``fail`` (HTTP 503) or ``stall`` (no answer until the server closes)."""

    daemon_threads = True
    mode = "serve"
    next_mode = "serve"
    host = None  # this host, as a single-node group's frontend
    address = "127.0.0.1"
    model = "tiny"
    closing = threading.Event()

    @property
    def port(self) -> int:
        return self.server_address[1]


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.mode == "stall":
            self.server.closing.wait(BOUND * 3)
            return
        if self.server.mode == "fail":
            self.send_error(503, "no worker")
            return
        tokens = body["max_tokens"]
        routed = {"prefill_worker_id": WORKER, "prefill_dp_rank": 1}
        reply = {"usage": {"completion_tokens": tokens, "prompt_tokens": len(body["prompt"])},
                 "nvext": {"worker_id": routed}}  # fmt: skip
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def frontend() -> Iterator[Frontend]:
    server = Frontend(("127.0.0.1", ports.free_port()), Handler)
    server.closing = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()


def run_load(server: Frontend, served_first: int) -> tuple[load.Measured, float]:
    """A load on ``server``: ``served_first`` served, then the server's mode switched to
    ``server.next_mode``, and the load finished once a request sent after the switch ended;
    (its measures, when the mode switched)."""
    flow = load.Load(server, concurrency=2, bound=BOUND)
    try:
        flow.wait_served(served_first, 60)
        switched = time.monotonic()
        server.mode = server.next_mode
        # One request sent after the switch has ended, in the new mode, before the load stops.
        wait_for(lambda: any(r["sent"] >= switched for r in flow.records), BOUND * 3 + 30, "")
        return flow.finish(), switched
    finally:
        flow.close()


def test_served_requests_carry_their_routing_and_none_fails() -> None:
    with frontend() as server:
        measured, _switched = run_load(server, 6)
    assert measured.sent >= 6
    assert measured.failed == [] and measured.hung == 0
    assert {(r["worker"], r["rank"]) for r in measured.records} == {(WORKER, 1)}
    assert all(r["ended"] >= r["sent"] for r in measured.records)
    assert measured.first_served_after(0.0, {WORKER}) is not None
    assert measured.first_served_after(0.0, {WORKER + 1}) is None


def test_a_silent_frontend_ends_every_request_as_hung_at_the_bound() -> None:
    with frontend() as server:
        server.next_mode = "stall"
        measured, switched = run_load(server, 2)
    stalled = [r for r in measured.records if r.get("error") == load.HUNG]
    assert stalled, measured.summary()
    assert all(r.get("error") == load.HUNG for r in measured.records if r["sent"] >= switched)
    # Each ended at its bound, not later: the client gave up, nothing waited it out.
    assert all(BOUND <= r["ended"] - r["sent"] < BOUND + 2 for r in stalled), stalled
    assert measured.hung == len(stalled)


def test_errors_are_counted_with_the_first_one_named() -> None:
    with frontend() as server:
        server.next_mode = "fail"
        measured, switched = run_load(server, 2)
    assert measured.failed and measured.hung == 0
    assert measured.first_error.startswith("503"), measured.first_error
    assert all(r["sent"] < switched for r in measured.records if "error" not in r)


def test_a_windows_token_rate_spreads_each_request_over_its_life() -> None:
    tokens = load.OUTPUT_TOKENS
    records = [{"sent": 0.0, "ended": 4.0, "worker": WORKER, "rank": 0},
               {"sent": 2.0, "ended": 6.0, "worker": WORKER, "rank": 0},
               {"sent": 1.0, "ended": 3.0, "error": "503"}]  # fmt: skip
    measured = load.Measured(records, BOUND)
    # [0, 4): all of the first request, half of the second; the failed one counts nothing.
    assert measured.token_rate(0.0, 4.0) == (tokens + tokens / 2) / 4
    assert measured.token_rate(6.0, 8.0) == 0.0
    assert measured.succeeded == 2 and measured.first_error == "503"

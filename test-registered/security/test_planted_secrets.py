"""Secrets planted through SGLang's real launch path never leave a node through the overlay.

CPU-only, two nodes (attention DP, so the follower owns a publisher and runs its sidecar): the
leader through ``http_server.launch_server`` (``overlay_harness.providers.http_node``), the
follower through the real follower branch (``overlay_harness.node``). The installed release's
``ServerArgs`` fields are enumerated (not a hand list): every field the redaction rule names
secret gets a unique canary through its own flag, except the ones no launch here can carry
(``refused_here``: watermarking needs a CUDA device; 0.5.23 refuses ``--api-key`` next to
``--grpc-port``), which the builder's unit tests cover; ``--ssl-keyfile-password`` comes with a
throwaway certificate, since SGLang refuses it alone. Fields whose value can carry a secret by
shape get canaries in that shape: JSON (``hicache_storage_backend_extra_config``,
``model_loader_extra_config``), a Python literal (``deepep_config``), URL credentials and
signed-URL query parameters (``served_model_name``, ``otlp_traces_endpoint``,
``encoder_urls``). ``model_path`` keeps the config-only model directory: SGLang reads the model
config from it at launch, so a URL there would be dereferenced (the builder's unit tests cover a
credential URL in ``model_path``). Every canary also reaches ``launch_command`` (the nodes'
argv).

Scanned, with 0 canaries allowed: gRPC ``GetServerInfo`` of both nodes; the leader's HTTP
``/server_info`` from its real uvicorn server (HTTPS when ``--ssl-keyfile-password`` is
planted), whose ``internal_states`` come from the stand-in schedulers answering SGLang's
``GetInternalStateReq`` through the real DP controller with the resolved server args, as a real
scheduler does (``--enable-dp-attention-local-control-broadcast``, so the controller reaches
both DP groups itself); every log line of the overlay's loggers in both nodes' logs (SGLang's
own logging is configured through ``SGLANG_LOGGING_CONFIG_PATH`` to name each line's logger, the
overlay's at DEBUG), every line no SGLang logger claims, and the argv and environment of both
sidecars (``security.sidecar_dump``). SGLang's own log lines are counted and reported, not
asserted: they are upstream's (its ``server_args=`` line prints every field).
"""

import argparse
import contextlib
import dataclasses
import inspect
import json
import os
import secrets
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import msgspec
from overlay_harness import cluster, probes
from overlay_harness.cluster import EngineGroup, HttpLeader
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.contract.redaction import is_secret_name

register_cpu_ci(est_time=46, suite="base-a-test-cpu")

RELEASE = releases.installed_sglang_version() or ""
PROVIDER = "security.sidecar_dump"
OVERLAY_LOGGER = "sglang_sidecar_overlay"
LINE_MARK = "@@"
DUMP_DEADLINE = 240.0
# The route waits for the schedulers' internal state through the DP controller.
HTTP_DEADLINE = 120.0
LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"named": {"format": f"{LINE_MARK}%(name)s{LINE_MARK} %(message)s"}},
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": "named",
            "stream": "ext://sys.stderr",
        }
    },
    "root": {"level": "INFO", "handlers": ["stderr"]},
    "loggers": {OVERLAY_LOGGER: {"level": "DEBUG"}},
}


def server_arg_fields() -> list[tuple[str, object]]:
    """(name, default) of every field of the installed release's ``ServerArgs``."""
    if isinstance(ServerArgs, type) and issubclass(ServerArgs, msgspec.Struct):
        return [(field.name, field.default) for field in msgspec.structs.fields(ServerArgs)]
    return [(field.name, field.default) for field in dataclasses.fields(ServerArgs)]


def cli_flags() -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return dict(parser._option_string_actions)


def takes_text(action: argparse.Action | None) -> bool:
    return action is not None and action.nargs != 0 and action.type in (None, str)


def refused_here() -> dict[str, str]:
    """Secret fields no launch on this machine can carry, with SGLang's reason; the builder's
    unit tests (tests/test_redaction.py) cover them."""
    refused = {"watermark_key": "watermarking requires --device cuda (no GPU here)"}
    try:
        from sglang.srt.arg_groups import serving_hook
    except ImportError:
        return refused
    if "incompatible with --api-key" in inspect.getsource(serving_hook):
        reason = "--grpc-port is incompatible with --api-key/--admin-api-key"
        refused.update(api_key=reason, admin_api_key=reason)
    return refused


def canary() -> str:
    # 16 hex digits: unique, and also a valid watermark key (SGLang wants 1-16 hex digits).
    return secrets.token_hex(8)


def plant(fields: list[tuple[str, object]], flags: dict) -> tuple[list[str], dict[str, str]]:
    """Launch arguments planting canaries, and {label: canary}."""
    names = {name for name, _ in fields}
    args: list[str] = []
    planted: dict[str, str] = {}
    unsettable: list[str] = []

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    refused = refused_here()
    for name, _default in fields:
        if not is_secret_name(name) or name in refused:
            continue
        if takes_text(flags.get(flag(name))):
            planted[name] = canary()
            args += [flag(name), planted[name]]
        else:
            unsettable.append(name)
    if unsettable:
        raise AssertionError(f"secret-named fields with no way to set them: {unsettable}")

    def shaped(name: str, build) -> None:
        if name in names and takes_text(flags.get(flag(name))):
            values: dict[str, str] = {}

            def mark(label: str) -> str:
                values[f"{name}:{label}"] = canary()
                return values[f"{name}:{label}"]

            args.extend([flag(name), build(mark)])
            planted.update(values)

    shaped(
        "hicache_storage_backend_extra_config",
        lambda mark: json.dumps(
            {
                "access_key": mark("access_key"),
                "secret_key": mark("secret_key"),
                "auth": {"session": [{"token": mark("nested token")}]},
                "endpoint": f"s3://AKID:{mark('url password')}@bucket/prefix",
            }
        ),
    )
    shaped(
        "model_loader_extra_config",
        lambda mark: json.dumps(
            {
                "hf_token": mark("hf_token"),
                "url": f"https://h.example/m?X-Amz-Credential={mark('X-Amz-Credential')}"
                f"&X-Amz-Signature={mark('X-Amz-Signature')}&X-Amz-Date=20260101",
            }
        ),
    )
    shaped("deepep_config", lambda mark: repr({"secret_key": mark("python literal")}))
    shaped(
        "served_model_name",
        lambda mark: f"s3://{mark('url user')}:{mark('url password')}@bucket/m"
        f"?X-Amz-Security-Token={mark('X-Amz-Security-Token')}&sig={mark('sig')}"
        f"&token={mark('token')}&signature={mark('signature')}",
    )
    shaped("otlp_traces_endpoint", lambda mark: f"http://otel:{mark('url password')}@c:4317")
    shaped("encoder_urls", lambda mark: f"https://{mark('url token')}@encoder.example:8997")
    return args, planted


def tls_files(directory: Path) -> list[str]:
    """A throwaway self-signed certificate and key: SGLang refuses ``--ssl-keyfile-password``
    without them, so planting that secret means serving HTTPS."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]


def forms(value: str) -> list[str]:
    """The canary and its decimal rendering (a resolved hex key could be kept as an int)."""
    return [value, str(int(value, 16))]


def dumped(prefix: Path) -> list[Path]:
    return sorted(prefix.parent.glob(f"{prefix.name}.*[0-9].json"))


def found_in(text: str, planted: dict[str, str]) -> list[str]:
    return sorted(label for label, value in planted.items() if any(f in text for f in forms(value)))


class TestPlantedSecrets(CustomTestCase):
    def test_no_planted_canary_leaves_a_node(self):
        fields = server_arg_fields()
        plant_args, planted = plant(fields, cli_flags())
        self.assertGreaterEqual(len(planted), 10, planted)
        with tempfile.TemporaryDirectory(prefix="overlay-secrets-") as tmp:
            workdir = Path(tmp)
            model = cluster.write_tiny_model(workdir / "tiny-llama")
            tls = "ssl_keyfile_password" in planted
            if tls:
                plant_args = plant_args + tls_files(workdir)
            config = workdir / "logging.json"
            config.write_text(json.dumps(LOGGING_CONFIG))
            # Local control broadcast: the DP controller sends the internal-state request of
            # HTTP /server_info to both DP groups' schedulers itself (see overlay_harness.standin).
            group = EngineGroup(
                model,
                2,
                ["--tp", "2", "--dp", "2", "--enable-dp-attention",
                 "--enable-dp-attention-local-control-broadcast"],
            )  # fmt: skip
            dumps = {"leader": workdir / "leader", "follower": workdir / "follower"}
            arg_lists = [
                group.for_node(0, PROVIDER, ["--dump", str(dumps["leader"])]) + plant_args,
                group.for_node(1, PROVIDER, ["--sidecar-on-followers", "--dump",
                                             str(dumps["follower"])]) + plant_args,
            ]  # fmt: skip
            env = {"SGLANG_LOGGING_CONFIG_PATH": str(config)}
            texts: dict[str, str] = {}
            started: list[cluster.Node] = []
            with mock.patch.dict(os.environ, env), contextlib.ExitStack() as stack:
                started = cluster.start_nodes(
                    lambda args, index: (HttpLeader, cluster.Node)[index](
                        args, workdir, ("leader", "follower")[index]
                    ),
                    arg_lists,
                )
                stack.callback(cluster.stop_all, started, 10)
                try:
                    for node in started:
                        event = node.ready()
                        self.assertEqual(event["event"], "ready", f"{event}\n{node.log_tail()}")
                    for node, role in zip(started, ("leader", "follower"), strict=True):
                        texts[f"grpc {role}"] = node.inside(
                            probes.server_info_text, node.grpc_port, node.address
                        )
                    leader = started[0]
                    status, http_text = leader.inside(
                        probes.http_text, group.http_ports[0], leader.address, "/server_info", tls
                    )
                    self.assertEqual(status, 200, http_text[:2000])
                    states = json.loads(http_text)["internal_states"]
                    # Both DP groups' schedulers answered: the scan covers their server args.
                    self.assertEqual([s.get("tp_size") for s in states], [2, 2], http_text[:2000])
                    texts["http leader /server_info"] = http_text
                    for role, prefix in dumps.items():
                        path = cluster.wait_for(
                            lambda prefix=prefix: dumped(prefix),
                            DUMP_DEADLINE,
                            f"the {role} sidecar to record its argv and environment",
                        )[0]
                        texts[f"sidecar {role} argv+environ"] = path.read_text()
                except BaseException:
                    for node in started:
                        sys.stderr.write(f"--- {node.name} log (tail) ---\n{node.log_tail(80)}\n")
                    raise
            # Nodes stopped: the logs now hold shutdown too.
            sglang_hits: dict[str, list[str]] = {}
            for node in started:
                overlay, unclaimed, upstream = self.split_log(node.log_path)
                self.assertGreater(len(overlay), 0, f"{node.name}: no overlay log line seen")
                texts[f"{node.name} overlay log ({len(overlay)} lines)"] = "\n".join(overlay)
                texts[f"{node.name} unclaimed log lines"] = "\n".join(unclaimed)
                sglang_hits[node.name] = found_in("\n".join(upstream), planted)

        leaks = {where: found_in(text, planted) for where, text in texts.items()}
        for where in texts:
            sys.stderr.write(f"[{RELEASE}] scanned {where}: {len(leaks[where])} canaries\n")
        sys.stderr.write(
            f"[{RELEASE}] planted {len(planted)} canaries ({len(fields)} ServerArgs fields): "
            f"{', '.join(sorted(planted))}\n"
        )
        for name, hits in sglang_hits.items():
            sys.stderr.write(
                f"[{RELEASE}] {name}: SGLang's own log lines (not the overlay's) show "
                f"{len(hits)} canaries\n"
            )
        self.maxDiff = None
        self.assertEqual({where: hits for where, hits in leaks.items() if hits}, {})
        total = sum(len(hits) for hits in leaks.values())
        sys.stderr.write(f"[{RELEASE}] canaries found by the scan: {total}\n")

    @staticmethod
    def split_log(path: Path) -> tuple[list[str], list[str], list[str]]:
        """(overlay lines, lines no logger claims, SGLang's own logger lines)."""
        overlay: list[str] = []
        unclaimed: list[str] = []
        upstream: list[str] = []
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(LINE_MARK) and LINE_MARK in line[len(LINE_MARK) :]:
                name = line[len(LINE_MARK) :].split(LINE_MARK, 1)[0]
                is_overlay = name == OVERLAY_LOGGER or name.startswith(f"{OVERLAY_LOGGER}.")
                (overlay if is_overlay else upstream).append(line)
            else:
                unclaimed.append(line)
        return overlay, unclaimed, upstream


if __name__ == "__main__":
    unittest.main()

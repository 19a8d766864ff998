"""Secrets planted through SGLang's real launch path never leave a node through the overlay.

CPU-only, two nodes (attention DP, so the follower owns a publisher and runs its sidecar), each
its own host, SGLang's real schedulers on the CPU test platform: the leader through
``http_server.launch_server``, the follower through SGLang's follower branch. The installed
release's ``ServerArgs`` fields are enumerated (not a hand list): every field the redaction
rule names secret gets a unique canary through its own flag, except the ones no launch here can
carry (``refused_here``: watermarking needs a CUDA device; 0.5.23 refuses ``--api-key`` next to
``--grpc-port``), which the builder's unit tests cover; ``--ssl-keyfile-password`` comes with a
throwaway certificate, since SGLang refuses it alone. Fields whose value can carry a secret by
shape get canaries in that shape: JSON (``hicache_storage_backend_extra_config``; not
``model_loader_extra_config``, which a real scheduler loading dummy weights refuses), a Python
literal (``deepep_config``), URL credentials and
signed-URL query parameters (``served_model_name``, ``otlp_traces_endpoint``,
``encoder_urls``). ``model_path`` keeps the config-only model directory: SGLang reads the model
config from it at launch, so a URL there would be dereferenced (the builder's unit tests cover
a credential URL in ``model_path``). Every canary also reaches ``launch_command`` (the nodes'
argv).

Scanned, with 0 canaries allowed: gRPC ``GetServerInfo`` of both nodes; the leader's HTTP
``/server_info`` from its real uvicorn server (HTTPS when ``--ssl-keyfile-password`` is
planted), whose ``internal_states`` come from both DP groups' real schedulers (SGLang's own
``get_internal_state``, through the real DP controller); every log line of the overlay's
loggers in both nodes' logs (SGLang's own logging is configured through
``SGLANG_LOGGING_CONFIG_PATH`` to name each line's logger, the overlay's at DEBUG), every line
no SGLang logger claims, and the argv and environment of both sidecars
(``security.sidecar_dump``). SGLang's own log lines are counted and reported, not asserted:
they are upstream's (its ``server_args=`` line prints every field). Positive controls, on
every served surface: every planted named field is served as ``<redacted>``; a canary under a
key the rule does not name secret (``prefix``, in the storage backend's JSON) is served as
planted, in that field and in ``launch_command``, so redaction is not blanket; and
``launch_command`` is served (redacted) where the release sets it.

On the rebuilt wheel the series' own modules' loggers (``sglang.srt.entrypoints.sidecar``,
``sglang.srt.utils.server_info``) are the ones scanned with 0 canaries allowed.

The same launch then serves two more checks: ``sglang-sidecar-overlay probe`` on the follower
(the ``dp_size`` switch off, as by default for this provider) says why a released consumer
rejects it on 0.5.22+, and the follower's engine process SIGKILLed takes its sidecar's shim and
provider down with it.
"""

import argparse
import dataclasses
import inspect
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

import msgspec
from overlay_harness import differences, nodes, probes
from overlay_harness.checks import alive, report_fault
from overlay_harness.group import EngineGroup
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase
from sglang_sidecar_overlay import releases
from sglang_sidecar_overlay.contract.redaction import REDACTED, is_secret_name

register_cpu_ci(est_time=46, suite="base-a-test-cpu")

RELEASE = releases.installed_sglang_version() or ""
PROVIDER = "security.sidecar_dump"
# The loggers of the code under test, scanned with 0 canaries allowed: the plugin's, or on the
# rebuilt wheel the series' modules (it logs through SGLang's loggers: DIFFERENCES.md #2).
OVERLAY_LOGGERS = (
    ("sglang.srt.entrypoints.sidecar", "sglang.srt.utils.server_info")
    if differences.differs(differences.PLUGIN_LOG_LINES)
    else ("sglang_sidecar_overlay",)
)
LINE_MARK = "@@"
DUMP_DEADLINE = 240.0
CLEAN_DEADLINE = 60.0
# 0.5.22+ report attention DP as dp_size=1, which released consumers check ranks against.
ATTENTION_DP_REPORTS_DP_SIZE_1 = releases.adapter_for(RELEASE or "0") == (
    "sglang_sidecar_overlay.adapters.v0_5_22"
)
# 0.5.19's ServerArgs has no launch_command: the contract serves null there.
LAUNCH_COMMAND_SERVED = RELEASE != "0.5.19"
# The field whose JSON carries the canaries by shape, and the canary under a non-secret key.
VISIBLE_CARRIER = "hicache_storage_backend_extra_config"
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
    "loggers": {name: {"level": "DEBUG"} for name in OVERLAY_LOGGERS},
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


def plant(
    fields: list[tuple[str, object]], flags: dict, visible: str
) -> tuple[list[str], dict[str, str]]:
    """Launch arguments planting canaries, and {label: canary}. ``visible`` goes under a key the
    rule does not name secret, next to the canaries: the control that redaction is not blanket."""
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

    # model_loader_extra_config would carry these, but a real scheduler loading dummy weights
    # refuses any loader extra config; the storage backend's config carries them instead.
    shaped(
        VISIBLE_CARRIER,
        lambda mark: json.dumps(
            {
                "access_key": mark("access_key"),
                "secret_key": mark("secret_key"),
                "hf_token": mark("hf_token"),
                "prefix": visible,
                "auth": {"session": [{"token": mark("nested token")}]},
                "endpoint": f"s3://AKID:{mark('url password')}@bucket/prefix",
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
        visible = canary()
        plant_args, planted = plant(fields, cli_flags(), visible)
        self.assertGreaterEqual(len(planted), 10, planted)
        with tempfile.TemporaryDirectory(prefix="overlay-secrets-") as tmp:
            workdir = Path(tmp)
            tls = "ssl_keyfile_password" in planted
            if tls:
                plant_args = plant_args + tls_files(workdir)
            config = workdir / "logging.json"
            config.write_text(json.dumps(LOGGING_CONFIG))
            group = EngineGroup(2, ["--tp", "2", "--dp", "2", "--enable-dp-attention"])
            dumps = {"leader": workdir / "leader", "follower": workdir / "follower"}
            env = {"SGLANG_LOGGING_CONFIG_PATH": str(config)}
            launches = [
                group.launch(0, sidecar=PROVIDER, sidecar_args=["--dump", str(dumps["leader"])],
                             extra=plant_args, env=env),
                group.launch(1, sidecar=PROVIDER, extra=plant_args, env=env,
                             sidecar_args=["--sidecar-on-followers", "--dump",
                                           str(dumps["follower"])]),
            ]  # fmt: skip
            texts: dict[str, str] = {}
            with nodes.running(*launches, names=["leader", "follower"], log_dir=workdir,
                               stop_timeout=10) as started:  # fmt: skip
                for node in started:
                    node.expect_ready()
                leader, follower = started
                for node in started:
                    texts[f"grpc {node.name}"] = node.inside(
                        probes.server_info_text, node.grpc_port, node.address
                    )
                status, http_text = leader.inside(
                    probes.http_text, leader.http_port, leader.address, "/server_info", tls
                )
                self.assertEqual(status, 200, http_text[:2000])
                states = json.loads(http_text)["internal_states"]
                # Both DP groups' real schedulers answered: the scan covers their state.
                self.assertEqual([s.get("tp_size") for s in states], [2, 2], http_text[:2000])
                texts["http leader /server_info"] = http_text
                sidecars = {}
                for role, prefix in dumps.items():
                    path = nodes.wait_for(
                        lambda prefix=prefix: dumped(prefix),
                        DUMP_DEADLINE,
                        f"the {role} sidecar to record its argv and environment",
                    )[0]
                    texts[f"sidecar {role} argv+environ"] = path.read_text()
                    sidecars[role] = json.loads(path.read_text())
                self.assert_positive_controls(texts, planted, visible)
                self.assert_probe_says_why_a_consumer_rejects(follower)
                self.assert_engine_kill_takes_the_sidecar_down(follower, sidecars["follower"])
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

    def assert_positive_controls(
        self, texts: dict[str, str], planted: dict[str, str], visible: str
    ) -> None:
        """The scan can see what it looks for, and redaction is not blanket: every served surface
        (gRPC of both nodes, HTTP) shows each planted named field as ``<redacted>``, the canary
        under a non-secret key as planted, and ``launch_command`` (where the release sets it)
        redacted with that canary still in it."""
        shown_fields = [VISIBLE_CARRIER] + (["launch_command"] if LAUNCH_COMMAND_SERVED else [])
        for where, text in texts.items():
            if not where.startswith(("grpc", "http")):
                continue
            info = json.loads(text)
            for name in (label for label in planted if ":" not in label):
                self.assertEqual(info.get(name), REDACTED, f"{where}: {name}")
            # Field by field: launch_command carries the carrier's JSON too, so a hit anywhere
            # in the text would pass with the field itself blanked.
            for field in shown_fields:
                self.assertIn(visible, str(info.get(field)), f"{where} {field}")
            if LAUNCH_COMMAND_SERVED:
                self.assertIn(REDACTED, info["launch_command"] or "", where)

    def assert_probe_says_why_a_consumer_rejects(self, follower: nodes.Node) -> None:
        """``sglang-sidecar-overlay probe --consumer dynamo`` on the follower (the ``dp_size``
        switch off): on 0.5.22+ (``dp_size=1`` for attention DP) it fails, naming Dynamo
        1.6.1's own refusal, while Dynamo 1.7's rule registers both ranks; before 0.5.22 both
        rules register both ranks and it passes."""
        target = f"{follower.address}:{follower.grpc_port}"
        probe = subprocess.run(
            follower.command([sys.executable, "-m", "sglang_sidecar_overlay", "probe", target,
                              "--timeout", "10", "--consumer", "dynamo"]),
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        output = probe.stdout + probe.stderr
        self.assertIn("dynamo-1.7 registers 2 DP ranks = rank space 2", output, output)
        if not ATTENTION_DP_REPORTS_DP_SIZE_1:
            self.assertIn("dynamo-1.6 registers 2 DP ranks = rank space 2", output, output)
            self.assertEqual(probe.returncode, 0, output)
            return
        refusal = 'dynamo-1.6 rejects this node: "KV source rank 1 is outside dp_size 1"'
        self.assertIn(refusal, output, output)
        self.assertEqual(probe.returncode, 1, output)
        line = next(line for line in output.splitlines() if refusal in line)
        sys.stderr.write(f"[{RELEASE}] probe --consumer dynamo, switch off: {line}\n")

    def assert_engine_kill_takes_the_sidecar_down(self, follower: nodes.Node, sidecar: dict):
        """SIGKILL the follower's engine process (no orderly stop): the sidecar's shim and
        provider go with it (parent-death signal, death pipe), and the node leaves nothing."""
        provider, shim = sidecar["pid"], sidecar["ppid"]
        self.assertTrue(alive(provider) and alive(shim))
        os.kill(follower.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        nodes.wait_for(
            lambda: not alive(provider) and not alive(shim),
            CLEAN_DEADLINE,
            "the follower sidecar's shim and provider to exit",
        )
        sidecar_gone = time.monotonic() - killed_at
        follower.proc.wait(timeout=CLEAN_DEADLINE)
        self.assertEqual(follower.proc.returncode, -signal.SIGKILL)
        follower.wait_gone(CLEAN_DEADLINE)
        report_fault(
            "follower engine process SIGKILLed while serving",
            f"exit {follower.proc.returncode} (SIGKILL); shim+provider gone in "
            f"{sidecar_gone:.2f} s",
            time.monotonic() - killed_at,
        )

    @staticmethod
    def split_log(path: Path) -> tuple[list[str], list[str], list[str]]:
        """(overlay lines, lines no logger claims, SGLang's own logger lines)."""
        overlay: list[str] = []
        unclaimed: list[str] = []
        upstream: list[str] = []
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(LINE_MARK) and LINE_MARK in line[len(LINE_MARK) :]:
                name = line[len(LINE_MARK) :].split(LINE_MARK, 1)[0]
                is_overlay = any(name == n or name.startswith(f"{n}.") for n in OVERLAY_LOGGERS)
                (overlay if is_overlay else upstream).append(line)
            else:
                unclaimed.append(line)
        return overlay, unclaimed, upstream


if __name__ == "__main__":
    unittest.main()

"""``sglang-sidecar-overlay``: the operator's commands ``status``, ``probe`` and ``selftest``.

Human output is one aligned line per check; ``--json`` prints one stable object (see the
operator guide). Logs go to stderr. Expected failures end with a one-line message and an
exit code, never a traceback:

- 0: all good (``status``: the overlay would be active);
- 1: something is wrong (``status``: inactive, with the reasons; ``probe``: a contract
  error, or a warning under ``--strict``; ``selftest``: a failed check);
- 2: bad command line (argparse);
- 3: ``probe`` could not talk to the node (bad address, closed port, timeout, not SGLang).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, TextIO

from sglang_sidecar_overlay import __version__
from sglang_sidecar_overlay import logger as package_logger
from sglang_sidecar_overlay.entry_point import PLUGIN_GROUP, PLUGIN_NAME, SGLANG_PLUGINS_ENV
from sglang_sidecar_overlay.tools.exit_codes import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    from sglang_sidecar_overlay.tools.probe import ProbeReport
    from sglang_sidecar_overlay.tools.probe.group import GroupReport

_MARKS = {"ok": "✓", "info": "·", "warning": "!", "error": "✗"}
_ASCII_MARKS = {"ok": "ok", "info": "..", "warning": "WARN", "error": "FAIL"}
_LABEL_WIDTH_CAP = 40


# --- status -------------------------------------------------------------------------------------


# What a node with the dp_size switch on serves, for status.
LEGACY_SHAPE = (
    "dp_size = the KV-publisher ranks, attn_dp_size = 1: registered exactly by Dynamo <= 1.6.1 "
    "(dp_rank < dp_size) and >= 1.7 (dp_rank < dp_size * attn_dp_size)"
)


def plugin_allowed(environ: Mapping[str, str]) -> bool:
    """Whether SGLang's ``SGLANG_PLUGINS`` allow-list lets the overlay load.

    SGLang treats an unset or empty value as "load every plugin"; otherwise only the
    comma-separated, whitespace-stripped names listed are loaded.
    """
    raw = environ.get(SGLANG_PLUGINS_ENV)
    if not raw:
        return True
    allowed = {name.strip() for name in raw.split(",") if name.strip()}
    return PLUGIN_NAME in allowed


def _entry_point() -> metadata.EntryPoint | None:
    for entry in metadata.entry_points(group=PLUGIN_GROUP):
        if entry.name == PLUGIN_NAME:
            return entry
    return None


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _native_status() -> dict[str, Any]:
    try:
        from sglang_sidecar_overlay import _native
    except ImportError as exc:
        return {"importable": False, "version": None, "build": None, "error": str(exc)}
    build = dict(_native.build_info()) if hasattr(_native, "build_info") else None
    version = getattr(_native, "__version__", None)
    return {"importable": True, "version": version, "build": build, "error": None}


def collect_status(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``status --json`` object: what SGLang would do with the overlay on this machine."""
    from sglang_sidecar_overlay import releases
    from sglang_sidecar_overlay.contract.legacy_dp_size import (
        DP_SIZE_CHECKING_SIDECARS,
        LEGACY_DP_SIZE_ENV,
        consumer_version,
        legacy_dp_size_enabled,
    )

    env = os.environ if environ is None else environ
    reasons: list[str] = []

    version = releases.installed_sglang_version()
    adapter = releases.adapter_for(version) if version else None
    adapter_present = adapter is not None and _module_present(adapter)
    if version is None:
        reasons.append("SGLang is not installed in this Python environment")
    elif adapter is None:
        reasons.append(
            f"SGLang {version} is not supported (supported: {releases.SUPPORTED_RANGE}); "
            "the plugin logs a warning and installs nothing"
        )
    elif not adapter_present:
        reasons.append(f"adapter module {adapter} is missing from this install")

    entry = _entry_point()
    plugin_module: str | None = None
    if entry is None:
        reasons.append(
            f"entry point {PLUGIN_GROUP}:{PLUGIN_NAME} is not visible "
            "(the wheel is not installed in this environment)"
        )
    else:
        plugin_module = entry.value.split(":", 1)[0].strip()
        if not _module_present(plugin_module):
            reasons.append(f"entry point target module {plugin_module} is missing")
    allowed = plugin_allowed(env)
    if not allowed:
        reasons.append(
            f"{SGLANG_PLUGINS_ENV}={env.get(SGLANG_PLUGINS_ENV)!r} does not list {PLUGIN_NAME}"
        )

    native = _native_status()
    if not native["importable"]:
        reasons.append(f"native module does not import: {native['error']}")

    legacy: dict[str, Any] = {"env": LEGACY_DP_SIZE_ENV, "value": env.get(LEGACY_DP_SIZE_ENV)}
    # What a launch decides: as set, or (unset) on for a --sidecar that checks rank widths.
    legacy["default_on_for"] = {}
    for sidecar in sorted(DP_SIZE_CHECKING_SIDECARS):
        distribution, installed = consumer_version(sidecar) or (None, None)
        legacy["default_on_for"][sidecar] = {"distribution": distribution, "version": installed}
    legacy["shape"] = LEGACY_SHAPE
    try:
        legacy["enabled"] = legacy_dp_size_enabled(env)
        legacy["error"] = None
    except ValueError as exc:
        legacy["enabled"] = False
        legacy["error"] = str(exc)
        reasons.append(str(exc))

    return {
        "active": not reasons,
        "reasons": reasons,
        "overlay_version": __version__,
        "sglang": {
            "installed": version is not None,
            "version": version,
            "supported": adapter is not None,
            "supported_range": releases.SUPPORTED_RANGE,
            "supported_versions": list(releases.SUPPORTED_VERSIONS),
            "adapter": adapter,
            "adapter_present": adapter_present,
        },
        "plugin": {
            "group": PLUGIN_GROUP,
            "name": PLUGIN_NAME,
            "entry_point_visible": entry is not None,
            "entry_point": None if entry is None else entry.value,
            "module_present": plugin_module is not None and _module_present(plugin_module),
            "sglang_plugins": env.get(SGLANG_PLUGINS_ENV),
            "allowed": allowed,
        },
        "native": native,
        "legacy_dp_size": legacy,
    }


def _status_lines(status: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    sglang = status["sglang"]
    plugin = status["plugin"]
    native = status["native"]
    legacy = status["legacy_dp_size"]
    lines: list[tuple[str, str, str]] = []
    if not sglang["installed"]:
        lines.append(("error", "SGLang", "not installed"))
    else:
        level = "ok" if sglang["supported"] else "error"
        support = "supported" if sglang["supported"] else "NOT supported"
        lines.append(
            (level, "SGLang", f"{sglang['version']} ({support}; {sglang['supported_range']})")
        )
    if sglang["adapter"]:
        level = "ok" if sglang["adapter_present"] else "error"
        lines.append((level, "adapter", sglang["adapter"]))
    else:
        lines.append(("info", "adapter", "none applies"))
    if plugin["entry_point_visible"]:
        text = f"{plugin['group']}: {plugin['name']} = {plugin['entry_point']}"
        if not plugin["module_present"]:
            text += " (module missing)"
        lines.append(("ok" if plugin["module_present"] else "error", "plugin entry point", text))
    else:
        lines.append(("error", "plugin entry point", f"{plugin['group']}:{plugin['name']} absent"))
    if plugin["sglang_plugins"]:
        level = "ok" if plugin["allowed"] else "error"
        verdict = "lists" if plugin["allowed"] else "excludes"
        text = f"{plugin['sglang_plugins']!r} {verdict} {plugin['name']}"
        lines.append((level, SGLANG_PLUGINS_ENV, text))
    else:
        lines.append(("ok", SGLANG_PLUGINS_ENV, "unset (every installed plugin loads)"))
    if native["importable"]:
        build = native["build"] or {}
        extra = ", ".join(str(build[key]) for key in ("profile", "target") if build.get(key))
        lines.append(("ok", "native module", f"{native['version']} ({extra})"))
    else:
        lines.append(("error", "native module", native["error"]))
    if legacy["error"]:
        lines.append(("error", "legacy dp_size", legacy["error"]))
    elif legacy["value"] is not None:
        state = "on" if legacy["enabled"] else "off"
        lines.append(("info", "legacy dp_size", f"{state} ({legacy['env']}={legacy['value']!r})"))
    else:
        consumers = ", ".join(
            f"{sidecar} ({found['distribution']} {found['version'] or 'not installed'})"
            for sidecar, found in legacy["default_on_for"].items()
        )
        text = f"unset ({legacy['env']}): on for --sidecar {consumers}, off for any other"
        lines.append(("info", "legacy dp_size", text))
    lines.append(("info", "legacy dp_size on", legacy["shape"]))
    return lines


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    status = collect_status()
    if args.json:
        _print_json(status, out)
    else:
        marks = _marks(out)
        print(f"sglang-sidecar-overlay {status['overlay_version']}", file=out)
        _print_lines(_status_lines(status), marks, out)
        if status["active"]:
            print("active: SGLang will load the overlay's hooks at startup", file=out)
        else:
            for reason in status["reasons"]:
                print(f"inactive: {reason}", file=out)
    return EXIT_OK if status["active"] else EXIT_PROBLEM


# --- probe --------------------------------------------------------------------------------------


def _probe_lines(report: ProbeReport) -> list[tuple[str, str, str]]:
    return [
        (finding.level, finding.field or finding.check, finding.message)
        for finding in report.findings
    ]


def _verdict(ok: bool, errors: int, warnings: int) -> str:
    word = "PASS" if ok else "FAIL"
    return (
        f"{word} ({errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)})"
    )


def cmd_probe(args: argparse.Namespace, out: TextIO) -> int:
    from sglang_sidecar_overlay.tools import probe

    if (args.target is None) == (args.group is None):
        print("probe: give one HOST:PORT or --group HOST:PORT HOST:PORT ...", file=sys.stderr)
        return EXIT_USAGE
    if args.watch is not None:
        if args.json or args.listen is not None or args.consumer is not None:
            print(
                "probe: --watch cannot be combined with --json, --listen or --consumer",
                file=sys.stderr,
            )
            return EXIT_USAGE
        from sglang_sidecar_overlay.tools.probe.watch import run_watch

        duration = None if math.isinf(args.watch) else args.watch
        return run_watch(args.group or [args.target], out, duration=duration, timeout=args.timeout)
    if args.group is not None:
        return _probe_group(args, out)
    report = probe.run_probe(
        args.target,
        timeout=args.timeout,
        listen_seconds=args.listen,
        strict=args.strict,
        consumers=_consumer_names(args),
    )
    if args.json:
        _print_json(report.to_json(), out)
    elif report.error is not None:
        print(f"probe: {report.error.message}", file=sys.stderr)
    else:
        print(
            f"probe {args.target}: GetServerInfo answered ({report.server_info_bytes} bytes)",
            file=out,
        )
        _print_lines(_probe_lines(report), _marks(out), out)
        errors, warnings = report.count(probe.ERROR), report.count(probe.WARNING)
        strict = " --strict" if args.strict and warnings else ""
        print(_verdict(report.ok, errors, warnings) + strict, file=out)
    return report.exit_code()


def _probe_group(args: argparse.Namespace, out: TextIO) -> int:
    from sglang_sidecar_overlay.tools.probe import ERROR, WARNING
    from sglang_sidecar_overlay.tools.probe.group import run_group_probe

    report = run_group_probe(
        args.group,
        timeout=args.timeout,
        listen_seconds=args.listen,
        strict=args.strict,
        consumers=_consumer_names(args),
    )
    if args.json:
        _print_json(report.to_json(), out)
        return report.exit_code()
    marks = _marks(out)
    print(f"probe --group: {len(report.targets)} node(s)", file=out)
    for line in group_node_lines(report):
        print(line, file=out)
    for node in report.nodes:
        bad = [f for f in node.findings if f.level in (ERROR, WARNING)]
        if bad:
            print(f"  {node.target}:", file=out)
            _print_lines(
                [(f.level, f.field or f.check, f.message) for f in bad], marks, out, "      "
            )
    print("group:", file=out)
    _print_lines([(f.level, f.field or f.check, f.message) for f in report.findings], marks, out)
    errors = report.count(ERROR) + sum(node.count(ERROR) for node in report.nodes)
    warnings = report.count(WARNING) + sum(node.count(WARNING) for node in report.nodes)
    print(_verdict(report.ok, errors, warnings), file=out)
    return report.exit_code()


def _consumer_names(args: argparse.Namespace) -> list[str] | None:
    """Every ``--consumer`` name given (each value may be a comma list); None when none was."""
    if args.consumer is None:
        return None
    return [name for names in args.consumer for name in names]


def group_node_lines(report: GroupReport) -> list[str]:
    """One line per node: node_rank, address, its ranks, health, launch."""
    lines = []
    for node in sorted(
        report.nodes, key=lambda n: repr((n.server_info or {}).get("node_rank", n.target))
    ):
        if node.error is not None:
            lines.append(f"  {node.target}: not probed ({node.error.kind})")
            continue
        info = node.server_info or {}
        sources = info.get("kv_event_sources")
        ranks = (
            ",".join(str(s.get("dp_rank")) for s in sources if isinstance(s, dict))
            if isinstance(sources, list)
            else "?"
        )
        launch = info.get("incarnation")
        launch_id = launch.get("id") if isinstance(launch, dict) else None
        health = node.health.get("status") if node.health else None
        lines.append(
            f"  node_rank {info.get('node_rank')}  {node.target}  ranks {ranks or 'none'}  "
            f"health {health}  launch {str(launch_id)[:12]}"
        )
    return lines


# --- selftest -----------------------------------------------------------------------------------


def cmd_selftest(args: argparse.Namespace, out: TextIO) -> int:
    from sglang_sidecar_overlay.tools import selftest

    report = selftest.run_selftest(listen_timeout=args.timeout)
    if args.json:
        _print_json(report.to_json(), out)
    else:
        marks = _marks(out)
        print(
            "selftest: follower metadata server fed by stand-in publishers "
            f"(ranks {', '.join(str(rank) for rank in selftest.LOCAL_RANKS)}), no GPU",
            file=out,
        )
        lines = [("ok" if c.ok else "error", c.name, c.detail) for c in report.checks]
        _print_lines(lines, marks, out)
        if report.probe is not None and report.probe.error is None:
            print(f"probe {report.target}:", file=out)
            _print_lines(_probe_lines(report.probe), marks, out, indent="    ")
        passed = sum(1 for check in report.checks if check.ok)
        word = "PASS" if report.ok else "FAIL"
        print(f"{word} ({passed}/{len(report.checks)} checks passed)", file=out)
    return EXIT_OK if report.ok else EXIT_PROBLEM


# --- output helpers -----------------------------------------------------------------------------


def _marks(out: TextIO) -> Mapping[str, str]:
    """Check marks, or ASCII words when the terminal's encoding cannot show them."""
    encoding = getattr(out, "encoding", None) or "ascii"
    try:
        "".join(_MARKS.values()).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return _ASCII_MARKS
    return _MARKS


def _print_lines(
    lines: Sequence[tuple[str, str, str]],
    marks: Mapping[str, str],
    out: TextIO,
    indent: str = "  ",
) -> None:
    width = min(max((len(label) for _, label, _ in lines), default=0), _LABEL_WIDTH_CAP)
    mark_width = max(len(mark) for mark in marks.values())
    for level, label, message in lines:
        print(f"{indent}{marks[level]:<{mark_width}} {label:<{width}}  {message}", file=out)


def _print_json(obj: Any, out: TextIO) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False), file=out)


# --- argument parsing ---------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be ≥ 0")
    return value


def _consumers(text: str) -> list[str]:
    from sglang_sidecar_overlay.tools.probe.consumers import parse_consumers

    try:
        return parse_consumers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-sidecar-overlay",
        description="Operator tools for the SGLang sidecar overlay: is it active, does a "
        "node serve the metadata contract, does this install work.",
        epilog="Exit codes: 0 ok, 1 problem found, 2 usage error, 3 node not reachable "
        "(probe). Logs go to stderr.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging on stderr (-vv: debug)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    status = commands.add_parser(
        "status",
        help="is the overlay active for the installed SGLang?",
        description="Installed SGLang version and support, the adapter that applies, the "
        "plugin entry point and SGLANG_PLUGINS, the native module, the legacy dp_size "
        "switch. Exit 0 when SGLang would load the overlay, 1 (with the reasons) when not.",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(handler=cmd_status)

    probe = commands.add_parser(
        "probe",
        help="check a node's GetServerInfo against the metadata contract",
        description="Call GetServerInfo on HOST:PORT, check what a KV-aware router relies "
        "on (one line per problem, naming the field), read grpc.health.v1 when served and, "
        "with --listen, subscribe to every advertised KV-event source and its replay "
        "endpoint. Run it on the node: advertised endpoints are node-local. --group checks "
        "every node of one engine group and the group as a whole; --watch shows a live view. "
        "Each released consumer rule (dynamo-1.6, dynamo-1.7) is reported with the DP ranks it "
        "would register against kv_event_rank_space.size; the consumers named by --consumer, "
        "else the one the node's sidecar runs, fail the probe when they would not register "
        "exactly the ranks that exist. Exit 0 when nothing is wrong, 1 on a contract error or "
        "a failing consumer (or a warning with --strict), 3 when the node (with --group: every "
        "node) cannot be reached or is not SGLang.",
    )
    probe.add_argument(
        "target", metavar="HOST:PORT", nargs="?", help="the node's native gRPC address"
    )
    probe.add_argument(
        "--group",
        metavar="HOST:PORT",
        nargs="+",
        default=None,
        help="every node of one engine group (any order): probe each, then check the group "
        "(one dist_init_addr and rank space, nnodes distinct node_ranks, every publisher rank "
        "advertised exactly once, equal block sizes and topics, every node healthy)",
    )
    probe.add_argument(
        "--watch",
        metavar="SECONDS",
        nargs="?",
        type=_positive_float,
        const=math.inf,
        default=None,
        help="live view per rank (events/s, last seq, gaps, resets, replayed, health), "
        "redrawn in place on a terminal, line output otherwise; stops on Ctrl-C or after "
        "SECONDS",
    )
    probe.add_argument(
        "--listen",
        metavar="SECONDS",
        type=_non_negative_float,
        default=None,
        help="subscribe to every source this long and report events per rank",
    )
    probe.add_argument(
        "--timeout",
        metavar="S",
        type=_positive_float,
        default=5.0,
        help="deadline for each RPC (default 5)",
    )
    probe.add_argument(
        "--consumer",
        metavar="NAME",
        type=_consumers,
        action="append",
        default=None,
        help="the consumer that reads these replies, repeatable or comma-separated: dynamo-1.6 "
        "(ai-dynamo <= 1.6.1), dynamo-1.7 (ai-dynamo >= 1.7), dynamo (both) or any (every "
        "rule the probe knows); its verdict fails the probe (exit 1) unless it would register "
        "exactly the ranks that exist. Default: the consumer the node's sidecar server "
        "argument runs (dynamo.sglang.sidecar: both Dynamo rules); none known: information only",
    )
    probe.add_argument("--strict", action="store_true", help="warnings fail the probe too")
    probe.add_argument("--json", action="store_true", help="print one JSON object")
    probe.set_defaults(handler=cmd_probe)

    selftest = commands.add_parser(
        "selftest",
        help="prove this install works, no GPU needed",
        description="Bind two stand-in KV-event publishers like SGLang schedulers do, build "
        "the node's server info with the core builder, serve it with the native metadata "
        "server and probe it with --listen while events are published. Exit 0 only if "
        "every check passed.",
    )
    selftest.add_argument(
        "--timeout",
        metavar="S",
        type=_positive_float,
        default=10.0,
        help="longest time to wait for events and replay (default 10)",
    )
    selftest.add_argument("--json", action="store_true", help="print one JSON object")
    selftest.set_defaults(handler=cmd_selftest)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    if not package_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        package_logger.addHandler(handler)
    package_logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    # grpcio's C core prints to stderr on its own; keep only its errors unless asked.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    try:
        # The subcommand's ``cmd_*``, set by build_parser().
        handler: Callable[[argparse.Namespace, TextIO], int] = args.handler
        return handler(args, sys.stdout)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `... | head` closed the pipe; nothing left to say.
        return EXIT_PROBLEM
    except Exception as exc:  # last resort: the guide promises one line, never a traceback
        detail = " ".join(str(exc).split())[:500]
        print(f"{args.command}: unexpected {type(exc).__name__}: {detail}", file=sys.stderr)
        return EXIT_PROBLEM


if __name__ == "__main__":
    sys.exit(main())

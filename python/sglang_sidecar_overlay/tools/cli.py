"""``sglang-sidecar-overlay``: the operator's commands ``status``, ``probe`` and ``selftest``.

Each command is one :class:`Command` (its help, its options, the function that runs it) and
returns the tools' one :class:`~sglang_sidecar_overlay.tools.report.Report`; ``main`` prints
the report (``--json``: one stable object, see the operator guide) and exits with its code.
Logs go to stderr. Expected failures end with a one-line message and an exit code, never a
traceback:

- 0: all good (``status``: the overlay would be active);
- 1: something is wrong (``status``: inactive, with the reasons; ``probe``: a contract
  error, or a warning under ``--strict``; ``selftest``: a failed check);
- 2: bad command line (argparse, or options that do not go together);
- 3: ``probe`` could not talk to the node (bad address, closed port, timeout, not SGLang).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from sglang_sidecar_overlay import __version__
from sglang_sidecar_overlay import logger as package_logger
from sglang_sidecar_overlay.tools.exit_codes import EXIT_INTERRUPTED, EXIT_PROBLEM, EXIT_USAGE
from sglang_sidecar_overlay.tools.report import Report, print_json

__all__ = ["COMMANDS", "Command", "UsageError", "build_parser", "main"]


class UsageError(Exception):
    """Options that parse one by one but do not go together (exit 2, one line)."""


# One option of a command: its flags and ``ArgumentParser.add_argument``'s keywords.
Option = tuple[tuple[str, ...], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: what ``--help`` says, its options, and what runs it.

    Every command also takes ``--json``; ``run`` gets the parsed options and the output
    stream (which only a live view draws on) and returns the report ``main`` prints.
    """

    name: str
    help: str
    description: str
    options: Sequence[Option]
    run: Callable[[argparse.Namespace, TextIO], Report]


# --- option types -------------------------------------------------------------------------------


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


# --- what each command runs ---------------------------------------------------------------------


def status_command(args: argparse.Namespace, out: TextIO) -> Report:
    from sglang_sidecar_overlay.tools.status import run_status

    return run_status()


def probe_command(args: argparse.Namespace, out: TextIO) -> Report:
    """One node, a group (``--group``), or either watched live (``--watch``)."""
    from sglang_sidecar_overlay.tools.probe import run_probe
    from sglang_sidecar_overlay.tools.probe.group import run_group_probe

    if (args.target is None) == (args.group is None):
        raise UsageError("give one HOST:PORT or --group HOST:PORT HOST:PORT ...")
    targets = args.group or [args.target]
    if args.watch is not None:
        return _run_watch(args, targets, out)
    consumers = None if args.consumer is None else [n for names in args.consumer for n in names]
    options: dict[str, Any] = {
        "timeout": args.timeout,
        "listen_seconds": args.listen,
        "strict": args.strict,
        "consumers": consumers,
    }
    if args.group is not None:
        return run_group_probe(targets, **options)
    return run_probe(args.target, **options)


def _run_watch(args: argparse.Namespace, targets: list[str], out: TextIO) -> Report:
    """The live view on ``out``; under ``--json`` nothing is drawn and the report is printed."""
    from sglang_sidecar_overlay.tools.probe.watch import run_watch

    if args.listen is not None or args.consumer is not None:
        raise UsageError("--watch cannot be combined with --listen or --consumer")
    duration = None if math.isinf(args.watch) else args.watch
    view = None if args.json else out
    return run_watch(targets, view, duration=duration, timeout=args.timeout)


def selftest_command(args: argparse.Namespace, out: TextIO) -> Report:
    from sglang_sidecar_overlay.tools import selftest

    return selftest.run_selftest(listen_timeout=args.timeout)


# --- the commands -------------------------------------------------------------------------------


def _timeout(default: float, text: str) -> Option:
    return (
        ("--timeout",),
        {"metavar": "S", "type": _positive_float, "default": default, "help": text},
    )


STATUS = Command(
    name="status",
    help="is the overlay active for the installed SGLang?",
    description="Installed SGLang version and support, the adapter that applies, the "
    "plugin entry point and SGLANG_PLUGINS, the native module, the legacy dp_size "
    "switch. Exit 0 when SGLang would load the overlay, 1 (with the reasons) when not.",
    options=(),
    run=status_command,
)

PROBE = Command(
    name="probe",
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
    options=(
        (
            ("target",),
            {"metavar": "HOST:PORT", "nargs": "?", "help": "the node's native gRPC address"},
        ),
        (
            ("--group",),
            {
                "metavar": "HOST:PORT",
                "nargs": "+",
                "default": None,
                "help": "every node of one engine group (any order): probe each, then check the "
                "group (one dist_init_addr and rank space, nnodes distinct node_ranks, every "
                "publisher rank advertised exactly once, equal block sizes and topics, every "
                "node healthy)",
            },
        ),
        (
            ("--watch",),
            {
                "metavar": "SECONDS",
                "nargs": "?",
                "type": _positive_float,
                "const": math.inf,
                "default": None,
                "help": "live view per rank (events/s, last seq, gaps, resets, replayed, "
                "health), redrawn in place on a terminal, line output otherwise; stops on "
                "Ctrl-C or after SECONDS (with --json: no view, one object at the end)",
            },
        ),
        (
            ("--listen",),
            {
                "metavar": "SECONDS",
                "type": _non_negative_float,
                "default": None,
                "help": "subscribe to every source this long and report events per rank",
            },
        ),
        _timeout(5.0, "deadline for each RPC (default 5)"),
        (
            ("--consumer",),
            {
                "metavar": "NAME",
                "type": _consumers,
                "action": "append",
                "default": None,
                "help": "the consumer that reads these replies, repeatable or comma-separated: "
                "dynamo-1.6 (ai-dynamo <= 1.6.1), dynamo-1.7 (ai-dynamo >= 1.7), dynamo (both) "
                "or any (every rule the probe knows); its verdict fails the probe (exit 1) "
                "unless it would register exactly the ranks that exist. Default: the consumer "
                "the node's sidecar server argument runs (dynamo.sglang.sidecar: both Dynamo "
                "rules); none known: information only",
            },
        ),
        (("--strict",), {"action": "store_true", "help": "warnings fail the probe too"}),
    ),
    run=probe_command,
)

SELFTEST = Command(
    name="selftest",
    help="prove this install works, no GPU needed",
    description="Bind two stand-in KV-event publishers like SGLang schedulers do, build "
    "the node's server info with the core builder, serve it with the native metadata "
    "server and probe it with --listen while events are published. Exit 0 only if "
    "every check passed.",
    options=(_timeout(10.0, "longest time to wait for events and replay (default 10)"),),
    run=selftest_command,
)

COMMANDS = (STATUS, PROBE, SELFTEST)


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
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        sub = subparsers.add_parser(
            command.name, help=command.help, description=command.description
        )
        for flags, options in command.options:
            sub.add_argument(*flags, **options)
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        sub.set_defaults(run=command.run)
    return parser


# --- running ------------------------------------------------------------------------------------


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    if not package_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        package_logger.addHandler(handler)
    package_logger.setLevel(level)


def emit(report: Report, as_json: bool, out: TextIO) -> int:
    """Print ``report`` (its JSON object, or its text) and return its exit code."""
    if as_json:
        print_json(report.to_json(), out)
    else:
        report.render(out)
    return report.exit_code()


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    # grpcio's C core prints to stderr on its own; keep only its errors unless asked.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    try:
        # The subcommand's ``Command.run``, set by build_parser().
        run: Callable[[argparse.Namespace, TextIO], Report] = args.run
        return emit(run(args, sys.stdout), args.json, sys.stdout)
    except UsageError as exc:
        print(f"{args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
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

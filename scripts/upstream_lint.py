"""Upstream SGLang's pre-commit hooks, at upstream's pinned versions, on the patch series.

Standard library only (plus ``git``); the hooks themselves run from a cached virtualenv
(``$SGLANG_OVERLAY_CACHE/tools/upstream-lint-<key>``, key = the pins below), built once with
``python3 -m venv`` and pip. ``scripts/patches.py lint`` applies the series to a scratch clone
of the released tree and calls :func:`lint_series` on it; this module knows nothing of how the
tree was made.

What runs, as upstream's ``.pre-commit-config.yaml`` lists it (pre-commit itself is not used:
it would fetch each hook's repository from GitHub):

- pre-commit-hooks 5.0.0: trailing-whitespace, end-of-file-fixer, check-yaml
  (``--allow-multiple-documents``), check-toml, check-ast, check-added-large-files,
  check-merge-conflict (with ``--assume-in-merge``: outside a merge the hook checks nothing),
  check-shebang-scripts-are-executable, detect-private-key, debug-statements, each on the file
  types its own manifest selects. check-symlinks and destroyed-symlinks look at symlinks only
  and no-commit-to-branch at the branch name: none of them reads a file's text.
- isort 5.13.2 (``--filter-files``) with upstream's ``.isort.cfg``: ``profile=black``,
  ``known_first_party=sglang``.
- black 24.10.0 (upstream's hook is black-jupyter; for ``.py`` files the same) with no
  configuration: upstream sets no ``[tool.black]``, so black's defaults apply (88 columns).
- codespell 2.4.1 with ``--toml python/pyproject.toml -L cann,thi,makro,wil,rouge,PRIS`` and
  the ``[tool.codespell]`` table of upstream's ``python/pyproject.toml``.

Everything runs in throwaway copies: ``patched/`` holds every file the series adds or changes
as the series leaves it, ``base/`` the changed ones as the released tree has them. Both are git
repositories with the files staged (the shebang and large-file hooks read the index), and both
carry the configuration files above.

What counts as a finding of the series: a new file must be clean. A changed file is judged
against its unpatched self, by the same hook in the same way:

- checkers (check-ast, debug-statements, codespell, ...) report lines; a finding of the patched
  file is the series' unless the unpatched file has the same finding (same hook, same message,
  same line text; counted, so a second copy of an old finding is new);
- fixers (trailing-whitespace, end-of-file-fixer, isort, black) judge the whole file, so each
  one is run on a copy of both versions and its edits are compared: every change the fixer
  makes to the patched file (a hunk: the lines it would replace and what it would put there)
  is a finding unless the fixer makes exactly the same change to the unpatched file. An
  unformatted region upstream already had stays allowed however far the series moved it; a
  region the series touched that the formatter would now rewrite differently is new.

One finding is one line: ``path:line: hook: message``, ``path`` in upstream's layout.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cache import cache_root, locked

# Upstream's pins (.pre-commit-config.yaml); tomli is the codespell hook's
# additional_dependencies entry, unpinned there.
TOOLS = (
    "pre-commit-hooks==5.0.0",
    "isort==5.13.2",
    "black==24.10.0",
    "codespell==2.4.1",
    "tomli",
)
# Upstream's configuration files, written into both copies.
ISORT_CFG = "[settings]\nprofile=black\nknown_first_party=sglang\n"
CODESPELL_TOML = (
    "[tool.codespell]\n"
    'ignore-words-list = "ans, als, hel, boostrap, childs, te, vas, hsa, ment"\n'
    'skip = "*.json,*.jsonl,*.patch,*.txt"\n'
)
CONFIG_FILES = {".isort.cfg": ISORT_CFG, "python/pyproject.toml": CODESPELL_TOML}
CODESPELL_ARGS = ("--toml", "python/pyproject.toml", "-L", "cann,thi,makro,wil,rouge,PRIS")
# The top-level exclude of upstream's config: generated gRPC code.
EXCLUDE = re.compile(r"^python/sglang/srt/grpc/")
PYTHON = (".py", ".pyi")


def log(message: str) -> None:
    print(f"[patches] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Hook:
    """One hook: its command in the tool venv, which files it takes, and whether it edits them
    (a fixer) or reports on them (a checker)."""

    name: str
    command: tuple[str, ...]
    suffixes: tuple[str, ...] | None  # None: every text file
    fixer: bool
    message: str = ""  # a fixer's finding, as pre-commit would word the failure


HOOKS = (
    Hook("trailing-whitespace", ("trailing-whitespace-fixer",), None, True, "trailing whitespace"),
    Hook("end-of-file-fixer", ("end-of-file-fixer",), None, True, "not one newline at the end"),
    Hook("check-yaml", ("check-yaml", "--allow-multiple-documents"), (".yaml", ".yml"), False),
    Hook("check-toml", ("check-toml",), (".toml",), False),
    Hook("check-ast", ("check-ast",), PYTHON, False),
    Hook("check-added-large-files", ("check-added-large-files",), None, False),
    Hook("check-merge-conflict", ("check-merge-conflict", "--assume-in-merge"), None, False),
    Hook(
        "check-shebang-scripts-are-executable",
        ("check-shebang-scripts-are-executable",),
        None,
        False,
    ),
    Hook("detect-private-key", ("detect-private-key",), None, False),
    Hook("debug-statements", ("debug-statement-hook",), PYTHON, False),
    Hook("isort", ("isort", "--filter-files"), PYTHON, True, "isort would reorder these imports"),
    Hook(
        "black", ("black", "-q", "--config", "{black_config}"), PYTHON, True, "black would reformat"
    ),
    Hook("codespell", ("codespell", *CODESPELL_ARGS), None, False),
)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int  # 0: the whole file
    hook: str
    message: str
    # What makes two findings the same one, with the line number left out.
    key: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.hook}: {self.message}"


# --- the tool venv ---------------------------------------------------------------------------


def tool_venv() -> Path:
    """The cached venv with upstream's hook packages at their pins (built on first use)."""
    key = hashlib.sha256(json.dumps([sys.version_info[:2], *TOOLS]).encode()).hexdigest()[:12]
    venv = cache_root() / "tools" / f"upstream-lint-{key}"
    with locked(venv.with_name(venv.name + ".lock")):
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            log(f"installing {', '.join(TOOLS)} into {venv}")
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *TOOLS], check=True
            )
            (venv / ".complete").write_text("\n".join(TOOLS) + "\n")
    return venv


# --- the copies ------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True
    ).stdout


def _copy_tree(files: dict[str, tuple[bytes, int]], target: Path) -> None:
    """``files`` (path -> (content, mode)) plus upstream's config files, staged in a new repo."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name, text in CONFIG_FILES.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text(text)
    for name, (data, mode) in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(data)
        (target / name).chmod(mode)
    _git(target, "init", "-q")
    _git(target, "add", "-A")


def _read_side(repo: Path, ref: str, paths: Sequence[str]) -> dict[str, tuple[bytes, int]]:
    """Each path's content and mode at ``ref`` of ``repo``."""
    out: dict[str, tuple[bytes, int]] = {}
    for path in paths:
        meta = _git(repo, "ls-tree", ref, "--", path).split()
        data = subprocess.run(
            ["git", "-C", str(repo), "show", f"{ref}:{path}"], check=True, capture_output=True
        ).stdout
        out[path] = (data, 0o755 if meta and meta[0] == "100755" else 0o644)
    return out


# --- running the hooks -----------------------------------------------------------------------


def _selects(hook: Hook, path: str) -> bool:
    return hook.suffixes is None or path.endswith(hook.suffixes)


def _command(hook: Hook, venv: Path, black_config: Path) -> list[str]:
    head, *rest = hook.command
    return [str(venv / "bin" / head), *(arg.format(black_config=black_config) for arg in rest)]


def _check(
    hook: Hook, command: list[str], tree: Path, paths: list[str], env: dict[str, str]
) -> list[Finding]:
    """A checker's findings: output lines ``path:line: message`` or naming a path."""
    result = subprocess.run(
        [*command, *paths], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode == 0:
        return []
    findings = []
    output = (result.stdout + result.stderr).splitlines()
    for raw in output:
        located = re.match(r"^(?P<path>[^\s:]+):(?P<line>\d+):(?:\d+:)?\s*(?P<msg>.*)$", raw)
        if located and located["path"] in paths:
            path, line, message = located["path"], int(located["line"]), located["msg"]
            text = (tree / path).read_text(errors="replace").splitlines()
            line_text = text[line - 1].strip() if 0 < line <= len(text) else ""
            findings.append(
                Finding(path, line, hook.name, message, (hook.name, message, line_text))
            )
            continue
        named = next((path for path in paths if path in raw), None)
        if named is not None:
            message = raw.replace(named, "").strip(" :") or "failed"
            findings.append(Finding(named, 0, hook.name, message, (hook.name, message)))
    if not findings:
        # A failure that names no file: the hook itself broke, which is no pass.
        raise SystemExit(
            f"{hook.name} exited {result.returncode} naming no file:\n" + "\n".join(output)
        )
    return findings


def _hunks(before: str, after: str) -> list[tuple[int, int, list[str], list[str]]]:
    """The fixer's edits: (first line, last line, old lines, new lines), lines 1-based."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    hunks = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
        None, old, new, autojunk=False
    ).get_opcodes():
        if tag != "equal":
            last = max(i2, i1 + 1)
            hunks.append(
                (min(i1 + 1, max(len(old), 1)), min(last, max(len(old), 1)), old[i1:i2], new[j1:j2])
            )
    return hunks


def _fix(
    hook: Hook,
    command: list[str],
    tree: Path,
    scratch: Path,
    paths: list[str],
    memo: Path,
    env: dict[str, str],
) -> list[Finding]:
    """A fixer's findings: one per hunk it changes, run on a copy of ``tree``.

    What the fixer made of a file is kept in ``memo`` under a hash of the file, the hook and
    the configuration, so an unchanged file (every upstream file of the base side, and the
    series' files between two edits) is not fixed again: black takes seconds on upstream's
    larger modules.
    """
    recipe = json.dumps([hook.command, CONFIG_FILES, TOOLS]).encode()
    keys = {p: hashlib.sha256(recipe + (tree / p).read_bytes()).hexdigest() for p in paths}
    todo = [path for path in paths if not (memo / keys[path]).exists()]
    if todo:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(tree, scratch, symlinks=True)
        result = subprocess.run(
            [*command, *todo], cwd=scratch, env=env, capture_output=True, text=True, check=False
        )
        same = [
            path for path in todo if (scratch / path).read_bytes() == (tree / path).read_bytes()
        ]
        if result.returncode != 0 and len(same) == len(todo):
            # It failed without fixing anything (black on a file it cannot parse): a finding
            # on every file it was given, and nothing remembered.
            reason = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
            message = f"failed: {reason[0]}"
            return [Finding(p, 0, hook.name, message, (hook.name, message)) for p in todo]
        memo.mkdir(parents=True, exist_ok=True)
        for path in todo:
            (memo / keys[path]).write_bytes((scratch / path).read_bytes())
    findings = []
    for path in paths:
        before = (tree / path).read_text(errors="replace")
        after = (memo / keys[path]).read_text(errors="replace")
        for first, last, old, new in _hunks(before, after):
            where = f"line {first}" if first == last else f"lines {first}-{last}"
            message = f"{hook.message} ({where})"
            key = (hook.name, "".join(old), "".join(new))
            findings.append(Finding(path, first, hook.name, message, key))
    return findings


def _run_hooks(venv: Path, tree: Path, paths: list[str], work: Path) -> list[Finding]:
    # black's own cache (a file it found formatted, by content hash) spares re-formatting the
    # unchanged upstream files on every run; kept with the venv, not in the user's home.
    env = {**os.environ, "BLACK_CACHE_DIR": str(venv / "black-cache")}
    # Given explicitly, so that no pyproject.toml above the copy or in the user's home counts.
    black_config = work / "black-defaults.toml"
    black_config.write_text("# upstream sets no [tool.black]: black's defaults\n")
    findings: list[Finding] = []
    for hook in HOOKS:
        selected = [p for p in paths if _selects(hook, p) and not EXCLUDE.match(p)]
        if not selected:
            continue
        command = _command(hook, venv, black_config)
        if hook.fixer:
            scratch = work / f"{tree.name}-{hook.name}"
            memo = venv / "fixed" / hook.name
            findings += _fix(hook, command, tree, scratch, selected, memo, env)
        else:
            findings += _check(hook, command, tree, selected, env)
    return findings


def _is_text(data: bytes) -> bool:
    return b"\0" not in data[:8192]


def lint_series(
    repo: Path, base_ref: str, new_ref: str, work: Path
) -> tuple[list[Finding], dict[str, str]]:
    """Upstream's hooks on every file ``new_ref`` (the patched tree) adds to or changes in
    ``base_ref`` (the released one), both in ``repo``.

    Returns the series' findings (see the module docstring) and each file's status
    (``A`` added, ``M`` modified).
    """
    venv = tool_venv()
    status: dict[str, str] = {}
    diff = _git(repo, "diff", "--no-renames", "--name-status", base_ref, new_ref)
    for line in diff.splitlines():
        state, path = line.split("\t", 1)
        if state in ("A", "M"):
            status[path] = state
    patched = _read_side(repo, new_ref, sorted(status))
    patched = {path: item for path, item in patched.items() if _is_text(item[0])}
    changed = sorted(path for path in patched if status[path] == "M")
    base = _read_side(repo, base_ref, changed)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _copy_tree(patched, work / "patched")
    _copy_tree(base, work / "base")
    after = _run_hooks(venv, work / "patched", sorted(patched), work)
    before = Counter(f.key for f in _run_hooks(venv, work / "base", changed, work))
    allowed: Counter[tuple[str, ...]] = Counter()
    findings = []
    for finding in after:
        if status[finding.path] == "M" and allowed[finding.key] < before[finding.key]:
            allowed[finding.key] += 1
            continue
        findings.append(finding)
    return findings, status


def summarize(findings: Sequence[Finding], say: Callable[[str], None] = log) -> None:
    """Counts per hook and file, one log line each."""
    counts = Counter((f.hook, f.path) for f in findings)
    for (hook, path), count in sorted(counts.items()):
        say(f"lint: {hook}: {path}: {count}")

#!/usr/bin/env python3
"""Apply the upstream patch series to the released SGLang tree and build a rebuilt wheel.

Standard library only (plus ``git``). The series under ``patches/sglang-<release>/`` is a
``git format-patch`` series in upstream's repository paths. Its base is the Python tree of the
released wheel (fetched once by ``sglang_wheel``), laid out as ``python/sglang/...`` in a
scratch git repository cached under ``$SGLANG_OVERLAY_CACHE/patched/``::

    base-<release>/            git repo, one commit: the wheel's sglang/ tree under python/
    apply-<release>/           scratch clone with the series applied (redone on every run)
    sglang-<release>-r<n>-<tree>/   the rebuilt wheel, keyed by the applied python/ tree id:
        sglang-<release>+sidecaroverlay.<n>-<tags>.whl

Each patch is first checked with ``git apply --check --verbose`` (an offset, fuzz or reject
fails the check), then applied with plain ``git am`` (no ``--3way``). The rebuilt wheel keeps
the released wheel's tags and metadata, with the local version ``+sidecaroverlay.<n>`` (``n``
= ``patches/sglang-<release>/REVISION``), and a RECORD listing the hash and size of every
file. ``check`` also installs it into a cached env built by ``envs.build_env`` exactly
like the stock envs (the torch wheels shared through the uv cache). The rebuilt wheel's test
session (``sglang_envs.py test --patched``) is built here too: :func:`patched_session`.

    scripts/patches.py check                    apply, repack, install (make patches-check)
    scripts/patches.py wheel --out dist-patched apply, repack, copy the wheel to --out
    scripts/patches.py base DIR                 a scratch repo at DIR for editing the series
    scripts/patches.py pr-descriptions          README's PR texts from the commit messages
    scripts/patches.py series-tests             the series' own test/registered files, rebuilt wheel
    scripts/patches.py lint [--series DIR]      upstream's pre-commit hooks on the files the series
                                                adds or changes (make patches-lint)
    scripts/patches.py upstream-tests --tests-dir DIR [--against both|stock|rebuilt]
                                                upstream's existing tests for the touched files,
                                                stock vs rebuilt (with patches/.../upstream-tests)
"""

from __future__ import annotations

import argparse
import base64
import csv
import email
import hashlib
import io
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import envs
import upstream_lint
from cache import cache_root, locked
from sessions import Session, names_paths
from sglang_wheel import sglang_wheel
from upstream_tests import UPSTREAM_TEST_CHANGES, upstream_tests

ROOT = Path(__file__).resolve().parent.parent

RELEASE = "0.5.23"
LOCAL_LABEL = "sidecaroverlay"
# Fixed identity and dates: the same series always gives the same commits and the same wheel.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "sglang wheel",
    "GIT_AUTHOR_EMAIL": "wheel@localhost",
    "GIT_COMMITTER_NAME": "sglang-sidecar-overlay patches check",
    "GIT_COMMITTER_EMAIL": "patches@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
ZIP_DATE = (2026, 1, 1, 0, 0, 0)


def log(message: str) -> None:
    print(f"[patches] {message}", file=sys.stderr, flush=True)


def series_dir(release: str = RELEASE) -> Path:
    return ROOT / "patches" / f"sglang-{release}"


def series(release: str = RELEASE) -> list[Path]:
    patches = sorted(series_dir(release).glob("*.patch"))
    if not patches:
        raise SystemExit(f"no patches in {series_dir(release)}")
    return patches


def revision(release: str = RELEASE) -> int:
    raw = (series_dir(release) / "REVISION").read_text().strip()
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"{series_dir(release) / 'REVISION'}: {raw!r} is not a positive integer")
    return int(raw)


def git(repo: Path, *args: str | os.PathLike, capture: bool = False) -> str:
    result = subprocess.run(
        ["git", "-C", str(repo), *[str(a) for a in args]],
        env={**os.environ, **GIT_ENV},
        check=False,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        command = " ".join(str(a) for a in args)
        raise SystemExit(f"git {command} failed in {repo}:\n{result.stdout}{result.stderr}")
    return result.stdout if capture else ""


# --- base tree -------------------------------------------------------------------------------


def base_repo(release: str = RELEASE) -> Path:
    """The cached scratch repo holding the released wheel's tree as one commit."""
    repo = cache_root() / "patched" / f"base-{release}"
    with locked(repo.with_name(repo.name + ".lock")):
        if (repo / ".complete").exists():
            return repo
        started = time.monotonic()
        shutil.rmtree(repo, ignore_errors=True)
        (repo / "python").mkdir(parents=True)
        wheel = sglang_wheel(release)
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if info.filename.startswith("sglang/") and not info.is_dir():
                    target = repo / "python" / info.filename
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(info))
                    mode = (info.external_attr >> 16) & 0o777
                    target.chmod(0o755 if mode & 0o111 else 0o644)
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", "-A", "python")
        git(repo, "commit", "-q", "-m", f"sglang {release}: Python tree of the released wheel")
        git(repo, "tag", "base")
        (repo / ".complete").write_text(wheel.name)
        log(f"base tree of {wheel.name} in {time.monotonic() - started:.1f} s")
    return repo


def scratch_clone(release: str, target: Path) -> Path:
    """A fresh clone of the base repo at ``target`` (objects shared, files checked out)."""
    base = base_repo(release)
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["git", "clone", "-q", "--shared", str(base), str(target)],
        env={**os.environ, **GIT_ENV},
        check=True,
    )
    return target


# --- apply -----------------------------------------------------------------------------------


def apply_series(repo: Path, patches: list[Path]) -> str:
    """Apply each patch exactly (no offset, fuzz or reject); return the id of python/."""
    for patch in patches:
        # git apply reports offsets ("Hunk #1 succeeded at 3585 (offset 1 line)") on stderr.
        check = subprocess.run(
            ["git", "-C", str(repo), "apply", "--check", "--verbose", str(patch.resolve())],
            env={**os.environ, **GIT_ENV},
            capture_output=True,
            text=True,
            check=False,
        )
        report = check.stdout + check.stderr
        inexact = [
            line
            for line in report.splitlines()
            if not line.startswith("Checking patch ")
            and any(word in line.lower() for word in ("offset", "fuzz", "reject", "error"))
        ]
        if check.returncode != 0 or inexact:
            raise SystemExit(f"{patch.name} does not apply exactly:\n" + "\n".join(inexact))
        git(repo, "am", "-q", patch.resolve())
        log(f"applied {patch.name}")
    # The wheel holds python/ only: a change to a test alone keeps the same wheel.
    return git(repo, "rev-parse", "HEAD:python", capture=True).strip()


# --- repack ----------------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _zip_info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, ZIP_DATE)
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def repack(repo: Path, release: str, out_dir: Path) -> Path:
    """The rebuilt wheel from ``repo``'s ``python/sglang`` tree, with a fresh RECORD."""
    version = f"{release}+{LOCAL_LABEL}.{revision(release)}"
    original = sglang_wheel(release)
    tags = original.name[len(f"sglang-{release}-") : -len(".whl")]
    dist_info = f"sglang-{version}.dist-info"
    old_dist_info = f"sglang-{release}.dist-info/"
    wheel = out_dir / f"sglang-{version}-{tags}.whl"
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = wheel.with_suffix(".tmp")
    records: list[tuple[str, str, int]] = []
    files = git(repo, "ls-files", "-s", "python/sglang", capture=True).splitlines()
    with zipfile.ZipFile(tmp, "w") as out, zipfile.ZipFile(original) as src:
        for line in sorted(files, key=lambda entry: entry.split("\t", 1)[1]):
            meta, path = line.split("\t", 1)
            mode = 0o755 if meta.split()[0] == "100755" else 0o644
            data = (repo / path).read_bytes()
            name = path[len("python/") :]
            out.writestr(_zip_info(name, mode), data)
            records.append((name, _record_hash(data), len(data)))
        for member in src.namelist():
            if not member.startswith(old_dist_info) or member.endswith(("/", "RECORD")):
                continue
            data = src.read(member)
            if member.endswith("METADATA"):
                data = data.replace(
                    f"\nVersion: {release}\n".encode(), f"\nVersion: {version}\n".encode(), 1
                )
                if f"\nVersion: {version}\n".encode() not in data:
                    raise SystemExit(f"no 'Version: {release}' line in {member}")
            name = dist_info + "/" + member[len(old_dist_info) :]
            out.writestr(_zip_info(name, 0o644), data)
            records.append((name, _record_hash(data), len(data)))
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        for name, digest, size in records:
            writer.writerow([name, digest, size])
        writer.writerow([f"{dist_info}/RECORD", "", ""])
        out.writestr(_zip_info(f"{dist_info}/RECORD", 0o644), text.getvalue())
    tmp.replace(wheel)
    verify_record(wheel)
    return wheel


def verify_record(wheel: Path) -> int:
    """Every file is in RECORD with its hash and size, and RECORD lists nothing else."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(archive.read(record_name).decode())))
        listed = {row[0]: row for row in rows}
        if set(listed) != set(names) or len(rows) != len(names):
            raise SystemExit(f"{wheel.name}: RECORD and archive members differ")
        for name in names:
            if name == record_name:
                continue
            data = archive.read(name)
            if listed[name][1:] != [_record_hash(data), str(len(data))]:
                raise SystemExit(f"{wheel.name}: RECORD entry of {name} is wrong")
    return len(names)


# --- the check -------------------------------------------------------------------------------


def build_patched_wheel(release: str = RELEASE) -> Path:
    """Apply the series to a fresh clone of the base tree and repack (cached by tree id)."""
    patches = series(release)
    work = cache_root() / "patched" / f"apply-{release}"
    with locked(work.with_name(work.name + ".lock")):
        repo = scratch_clone(release, work)
        tree = apply_series(repo, patches)
        log(f"{len(patches)} patches applied exactly; python/ tree {tree[:12]}")
        out_dir = cache_root() / "patched" / f"sglang-{release}-r{revision(release)}-{tree[:12]}"
        wheels = sorted(out_dir.glob("*.whl"))
        if (out_dir / ".complete").exists() and len(wheels) == 1:
            log(f"cached rebuilt wheel {wheels[0].name}")
            return wheels[0]
        shutil.rmtree(out_dir, ignore_errors=True)
        wheel = repack(repo, release, out_dir)
        (out_dir / ".complete").write_text(tree)
        log(f"rebuilt {wheel.name}: RECORD verified ({verify_record(wheel)} files)")
        return wheel


def patched_env(release: str = RELEASE) -> tuple[Path, Path]:
    """(rebuilt wheel, cached env with it installed)."""
    wheel = build_patched_wheel(release)
    env = envs.build_env(release, sglang_wheel=wheel)
    return wheel, env


# --- the rebuilt wheel's test session --------------------------------------------------------

# What the nodes' SGLANG_PLUGINS is set to in a --patched run: an allow-list naming no
# installed plugin, so SGLang skips the overlay (test-registered's harness reads it).
NO_PLUGIN = "none"
TEST_PLUGINS_ENV = "SGLANG_OVERLAY_TEST_PLUGINS"
# The rebuilt wheel runs every scenario of test-registered/: everything outside unit/, whose
# files test the plugin itself (patches/DIFFERENCES.md lists what may differ).
PLUGIN_ONLY_DIR = "test-registered/unit"
# Tells the tests which side they run on (test-registered/overlay_harness/differences.py).
SIDE_ENV, REBUILT_WHEEL = "SGLANG_OVERLAY_TEST_SIDE", "rebuilt-wheel"
PLUGIN_PROOF = (
    "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout); "
    "from sglang.srt.plugins import load_plugins; load_plugins(); "
    "from sglang_sidecar_overlay import plugin; "
    "print('overlay adapter:', plugin.installed_adapter())"
)


def prove_plugin_absent(env: Path) -> None:
    """Show, in the env and with the nodes' SGLANG_PLUGINS, that the plugin is not loaded."""
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    environ[envs.ENTRY_POINT.SGLANG_PLUGINS_ENV] = NO_PLUGIN
    python = env / "bin" / "python"
    out = subprocess.run(
        [python, "-W", "ignore", "-c", PLUGIN_PROOF],
        env=environ, cwd=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    status = subprocess.run(
        [env / "bin" / "sglang-sidecar-overlay", "status"],
        env=environ, cwd=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = [line for line in out.splitlines() if "overlay" in line]
    for line in lines + status.stdout.splitlines():
        envs.log(f"patched: {line}")
    if "overlay adapter: None" not in out or "sglang-sidecar-overlay: SGLang" in out:
        raise SystemExit("the overlay plugin loaded in the patched env")
    if status.returncode == 0:
        raise SystemExit("sglang-sidecar-overlay status says active in the patched env")
    envs.log("patched: plugin not loaded (status exit code 1: inactive)")


def patched_session(releases: list[str], wheel: Path, pytest_args: Sequence[str]) -> Session:
    """Every scenario file of test-registered (all but unit/) against the rebuilt wheel, the
    plugin not loaded."""
    if releases != [RELEASE]:
        raise SystemExit(f"--patched runs on {RELEASE} only (the series' base)")
    _, env = patched_env(RELEASE)
    envs.prepare_session_env(env, wheel)
    prove_plugin_absent(env)
    if not names_paths(pytest_args):
        pytest_args = [*pytest_args, f"--ignore={ROOT / PLUGIN_ONLY_DIR}"]
    sides = {TEST_PLUGINS_ENV: NO_PLUGIN, SIDE_ENV: REBUILT_WHEEL}
    return Session(f"{RELEASE} (rebuilt wheel)", env, pytest_args, sides)


def check(release: str) -> int:
    started = time.monotonic()
    wheel, env = patched_env(release)
    python = env / "bin" / "python"
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        check=True,
        capture_output=True,
        text=True,
        cwd=env,
    ).stdout.strip()
    if version != wheel.name.split("-")[1]:
        raise SystemExit(f"{env} has sglang {version}, expected the rebuilt {wheel.name}")
    log(f"env {env.name} runs sglang {version}")
    log(f"patches-check passed in {time.monotonic() - started:.1f} s")
    return 0


def series_tests(release: str) -> int:
    """The series' own ``test/registered`` files, each run as upstream's CI runs them."""
    _, env = patched_env(release)
    repo = cache_root() / "patched" / f"apply-{release}"
    files = sorted((repo / "test" / "registered").rglob("test_*.py"))
    if not files:
        raise SystemExit(f"no test/registered files in the applied series at {repo}")
    failed = []
    for test in files:
        started = time.monotonic()
        code = subprocess.run(
            [str(env / "bin" / "python"), "-W", "ignore", test.name], cwd=test.parent
        ).returncode
        log(f"{test.relative_to(repo)}: exit {code} in {time.monotonic() - started:.0f} s")
        if code != 0:
            failed.append(test.name)
    return 1 if failed else 0


def lint(release: str, patches_dir: Path | None = None) -> int:
    """Upstream's pre-commit hooks (``upstream_lint``) on the files the series adds or changes.

    The series (or the ``*.patch`` files of ``patches_dir``, to try a candidate before it
    replaces the series) is applied with ``git apply --cached`` to an index of the released
    tree in a bare clone of the base repo, ``lint-<release>.git`` (no work tree to check out:
    the hooks see only the files the series touches); the copies the hooks run on are under
    ``lint-<release>-work``. ``check`` is what proves the series applies exactly with
    ``git am``. Exit status 0 when the series adds no finding, 1 with one line per finding on
    stdout.
    """
    started = time.monotonic()
    patches = sorted(patches_dir.glob("*.patch")) if patches_dir else series(release)
    if not patches:
        raise SystemExit(f"no patches in {patches_dir}")
    repo = cache_root() / "patched" / f"lint-{release}.git"
    with locked(repo.with_name(repo.name + ".lock")):
        if not (repo / ".complete").exists():
            shutil.rmtree(repo, ignore_errors=True)
            git(base_repo(release), "clone", "-q", "--bare", "--shared", ".", repo)
            (repo / ".complete").write_text(release)
        tree = _apply_to_index(repo, patches)
        log(f"lint: {len(patches)} patches applied to the index; tree {tree[:12]}")
        findings, status = upstream_lint.lint_series(
            repo, "HEAD", tree, repo.with_name(f"lint-{release}-work")
        )
    new = sum(1 for state in status.values() if state == "A")
    log(f"lint: {len(status)} files ({new} new, {len(status) - new} changed)")
    for finding in findings:
        print(finding)
    upstream_lint.summarize(findings)
    elapsed = time.monotonic() - started
    if findings:
        log(f"lint: {len(findings)} findings of the series in {elapsed:.0f} s")
        return 1
    log(f"lint: clean in {elapsed:.0f} s")
    return 0


def _apply_to_index(repo: Path, patches: list[Path]) -> str:
    """The tree of HEAD with ``patches`` applied, built in a private index of ``repo``."""
    index = {**os.environ, **GIT_ENV, "GIT_INDEX_FILE": str(repo / "lint-index")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(repo), *args], env=index, capture_output=True, text=True, check=False
        )

    if run("read-tree", "HEAD").returncode != 0:
        raise SystemExit(f"git read-tree HEAD failed in {repo}")
    for patch in patches:
        applied = run("apply", "--cached", str(patch.resolve()))
        if applied.returncode != 0:
            raise SystemExit(f"{patch.name} does not apply:\n{applied.stderr}")
    return run("write-tree").stdout.strip()


PR_SECTION = "## PR descriptions (ready to paste)"


def pr_descriptions(release: str) -> int:
    """Rewrite the README's PR-descriptions section from the series' commit messages; the
    hand-written sections after it (the first ``## `` heading not inside a description's
    code block) are kept."""
    readme = ROOT / "patches" / "README.md"
    text = readme.read_text()
    head, _, rest = text.partition(PR_SECTION)
    head = head.rstrip("\n")
    tail, fenced = "", False
    for offset, line in _lines_with_offsets(rest):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            tail = rest[offset:]
            break
    out = [
        head,
        "",
        PR_SECTION,
        "",
        "Each is the patch's commit message; its title is the PR title.",
        "",
    ]
    for patch in series(release):
        message = email.message_from_string(patch.read_text())
        subject = " ".join(str(message["Subject"]).split()).split("] ", 1)[-1]
        body = str(message.get_payload()).split("\n---\n", 1)[0].strip()
        out += [f"### {patch.name[:4]}: {subject}", "", "```text", body, "```", ""]
    if tail:
        out += [tail.rstrip("\n"), ""]
    readme.write_text("\n".join(out))
    return 0


def _lines_with_offsets(text: str) -> list[tuple[int, str]]:
    lines, offset = [], 0
    for line in text.splitlines(keepends=True):
        lines.append((offset, line))
        offset += len(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", default=RELEASE, choices=[RELEASE])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="apply, repack, verify RECORD, install into a cached env")
    wheel = commands.add_parser("wheel", help="apply, repack, copy the rebuilt wheel")
    wheel.add_argument("--out", type=Path, default=ROOT / "dist-patched")
    base = commands.add_parser("base", help="a scratch repo with the base tree, for editing")
    base.add_argument("dir", type=Path)
    commands.add_parser("pr-descriptions", help="refresh README's PR descriptions from the series")
    commands.add_parser("series-tests", help="the series' own tests against the rebuilt wheel")
    lint_parser = commands.add_parser("lint", help="upstream's pre-commit hooks on the series")
    lint_parser.add_argument(
        "--series",
        type=Path,
        default=None,
        help="lint the *.patch files of this directory instead of patches/sglang-<release>",
    )
    upstream = commands.add_parser("upstream-tests", help="upstream's tests of touched files")
    upstream.add_argument("--tests-dir", type=Path, default=cache_root() / "upstream-sglang")
    upstream.add_argument(
        "--against",
        choices=["both", "stock", "rebuilt"],
        default="both",
        help="run on the released wheel, the rebuilt one (with the series' test changes), or "
        "both and compare (default)",
    )
    upstream.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)

    if args.command == "check":
        return check(args.release)
    if args.command == "wheel":
        built = build_patched_wheel(args.release)
        args.out.mkdir(parents=True, exist_ok=True)
        for stale in args.out.glob("sglang-*.whl"):
            stale.unlink()
        shutil.copy2(built, args.out / built.name)
        print(args.out / built.name)
        return 0
    if args.command == "base":
        scratch_clone(args.release, args.dir)
        print(args.dir)
        return 0
    if args.command == "pr-descriptions":
        return pr_descriptions(args.release)
    if args.command == "series-tests":
        return series_tests(args.release)
    if args.command == "lint":
        return lint(args.release, args.series.resolve() if args.series else None)
    release = args.release
    pythons = {
        "stock": lambda: envs.build_env(release) / "bin" / "python",
        "rebuilt": lambda: patched_env(release)[1] / "bin" / "python",
    }
    return upstream_tests(
        release,
        args.tests_dir.resolve(),
        args.against,
        args.pytest_args,
        changes_dir=series_dir(release) / UPSTREAM_TEST_CHANGES,
        pythons=pythons,
    )


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fail when modules of this tree import each other in a cycle (standard library only).

    python3 scripts/import_cycles.py [--show-graph]

Every ``.py`` file under ``python/``, ``scripts/``, ``tests/`` and ``test-registered/`` is a
module named as it is imported: ``python/sglang_sidecar_overlay/tools/cli.py`` is
``sglang_sidecar_overlay.tools.cli``, ``scripts/bench/load.py`` is ``bench.load`` (scripts put
``scripts/`` on the path), a test or helper file is named from the first folder above it that
is no package. A tree's own modules shadow the others' (two trees both have a ``conftest``);
the package (``python/``) and ``scripts/`` are importable from every tree.

Every ``import`` counts, those inside functions too: a lazy import still ties the two modules
together. ``from package import name`` is an edge to ``package.name`` when that is a module,
else to ``package``. Importing a submodule is an edge to it alone, not to its package's
``__init__`` (as import-linter and pydeps count). Exits 1 and prints each cycle when there is
one.

It also bounds how deep the adapters stack (``--max-depth``, 4 by default): the longest chain
of imports, counted the same way, from one module of ``sglang_sidecar_overlay.adapters``
through others of it, in files. Exits 1 and prints the chain when it is deeper.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("python", "scripts", "tests", "test-registered")
# Where a module of each tree can import from: its own tree first.
SEARCH = {tree: (tree, "python", "scripts") for tree in TREES}

Module = tuple[str, str]  # (tree, dotted name)
ADAPTERS = "sglang_sidecar_overlay.adapters"


def module_name(path: Path, tree: Path) -> str:
    """The name ``path`` is imported by: from the first folder above it without ``__init__``."""
    parts = [path.stem] if path.stem != "__init__" else []
    folder = path.parent
    while folder != tree and (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    if path.stem == "__init__" and not parts:
        parts = [path.parent.name]
    return ".".join(parts)


def modules() -> dict[Module, Path]:
    found: dict[Module, Path] = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if any(part.startswith(".") or part == "__pycache__" for part in path.parts):
                continue
            found.setdefault((tree, module_name(path, ROOT / tree)), path)
    return found


def resolve(name: str, tree: str, known: dict[Module, Path]) -> Module | None:
    for where in SEARCH[tree]:
        if (where, name) in known:
            return where, name
    return None


def _imported(node: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = name if is_package else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        for alias in node.names:
            yield f"{base}.{alias.name}"
            yield base


def imports(module: Module, path: Path, known: dict[Module, Path]) -> set[Module]:
    """The modules of this repository that ``module`` imports."""
    tree, name = module
    targets: set[Module] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        candidates = list(_imported(node, name, path.stem == "__init__"))
        found = {m for m in (resolve(c, tree, known) for c in candidates) if m is not None}
        if isinstance(node, ast.ImportFrom):
            # ``from a import b``: the submodule a.b when there is one, else a itself.
            found = {m for m in found if not any(o[1].startswith(m[1] + ".") for o in found)}
        targets.update(found)
    targets.discard(module)
    return targets


def cycles(graph: dict[Module, set[Module]]) -> list[list[Module]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[Module, int] = {}
    low: dict[Module, int] = {}
    stack: list[Module] = []
    on_stack: set[Module] = set()
    found: list[list[Module]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def deepest_chain(graph: dict[Module, set[Module]], members: set[Module]) -> list[Module]:
    """The longest import chain that stays among ``members`` (an acyclic part of ``graph``)."""
    longest: dict[Module, list[Module]] = {}

    def chain(module: Module) -> list[Module]:
        if module not in longest:
            below = [chain(target) for target in sorted(graph[module] & members)]
            longest[module] = [module, *max(below, key=len, default=[])]
        return longest[module]

    return max((chain(module) for module in sorted(members)), key=len, default=[])


def adapters_depth(graph: dict[Module, set[Module]], limit: int) -> bool:
    """Print the adapters' deepest import chain; False when it is over ``limit``."""
    members = {m for m in graph if m[0] == "python" and m[1].startswith(ADAPTERS + ".")}
    deepest = deepest_chain(graph, members)
    names = " -> ".join(name.rpartition(".")[2] for _, name in deepest)
    print(f"adapters import depth {len(deepest)} (at most {limit}): {names}")
    return len(deepest) <= limit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show-graph", action="store_true", help="print every module's imports")
    parser.add_argument(
        "--max-depth", type=int, default=4, help="the adapters' deepest import chain, in files"
    )
    args = parser.parse_args(argv)
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    if args.show_graph:
        for module in sorted(graph):
            targets = ", ".join(name for _, name in sorted(graph[module])) or "-"
            print(f"{module[0]}: {module[1]}: {targets}")
    found = cycles(graph)
    for component in found:
        print("import cycle: " + " <-> ".join(name for _, name in component), file=sys.stderr)
    edges = sum(len(targets) for targets in graph.values())
    print(f"{len(graph)} modules, {edges} imports between them, {len(found)} cycle(s)")
    if found:
        return 1
    return 0 if adapters_depth(graph, args.max_depth) else 1


if __name__ == "__main__":
    sys.exit(main())

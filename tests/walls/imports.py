"""The house's import graph, read from the source (no module is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("hctool", "engine", "repros")


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    mods = {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}
    _MODULES.update(mods)
    return mods


def imports(path: Path, name: str, module_level_only: bool = False) -> set[str]:
    """Every module this file imports (absolute names; relative imports resolved). `from pkg
    import sub` of a submodule counts as importing pkg.sub (a package's __init__ runs first
    in any case, and one that imports nothing at module level adds no cycle)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in _runtime_imports(tree, module_level_only):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in _MODULES}
            out.update(subs)
            if len(subs) < len(node.names):  # some names are attributes of base itself
                out.add(base)
    return out


def _runtime_imports(tree: ast.Module, module_level_only: bool):
    """The import statements that run: `if TYPE_CHECKING:` blocks are for a type checker only."""

    def walk(body):
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            # module level: what runs on import (if/try/with blocks); else every body, functions too
            if not module_level_only or isinstance(node, (ast.If, ast.Try, ast.With, ast.ExceptHandler)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    yield from walk(getattr(node, field, None) or [])

    yield from walk(tree.body)


_MODULES = set()


def graph(module_level_only: bool = True, packages: bool = True) -> dict[str, set[str]]:
    """Who imports whom. `packages`: importing pkg.sub runs pkg's __init__ first, so it is an
    edge to pkg too (except to the importer's own packages, which are running already)."""
    mods = modules()
    out = {}
    for m, p in mods.items():
        deps = {i for i in imports(p, m, module_level_only) if i in mods and i != m}
        if packages:
            deps |= {
                ".".join(d.split(".")[:k])
                for d in list(deps)
                for k in range(1, d.count(".") + 1)
                if ".".join(d.split(".")[:k]) in mods and not (m + ".").startswith(".".join(d.split(".")[:k]) + ".")
            }
        out[m] = deps - {m}
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10000)
    for v in g:
        if v not in index:
            visit(v)
    return out

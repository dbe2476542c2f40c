"""Checking `pkg.mod:Qual.name` before anything runs: a fault or probe on a name that does not
resolve is a usage error (exit 2), not a run that silently injects nothing. The check reads
source, it imports nothing of the user's: the module's file is found on the job's search path
(the working directory, the script's folder, PYTHONPATH, this Python's sys.path) and its AST
must define the qualified name (a def or class, a module-level assignment or import)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path


def _search_path(main_source: Path | None, env: dict[str, str]) -> list[str]:
    out = [os.getcwd()]
    if main_source is not None:
        out.append(str(main_source.resolve().parent))
    out += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    out += [p for p in sys.path if p]
    return list(dict.fromkeys(out))


def module_source(module: str, main_source: Path | None = None, env: dict[str, str] | None = None) -> Path | None:
    env = dict(os.environ if env is None else env)
    parts = module.split(".")
    for base in _search_path(main_source, env):
        here = Path(base).joinpath(*parts)
        for candidate in (here.with_suffix(".py"), here / "__init__.py"):
            if candidate.is_file():
                return candidate
    # An editable install or a namespace package: ask a throwaway interpreter (it may import
    # the module's parent packages; never this process).
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import importlib.util, sys\n"
                "s = importlib.util.find_spec(sys.argv[1])\nprint(s.origin if s and s.origin else '')",
                module,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    origin = out.stdout.strip()
    return Path(origin) if out.returncode == 0 and origin.endswith(".py") and Path(origin).is_file() else None


def _defines(body: list[ast.stmt], name: str):
    """The node defining `name` in a module or class body (None: not statically there)."""
    found = None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found = found or node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            found = found or node
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            found = found or node
        elif isinstance(node, (ast.If, ast.Try)):  # definitions under `if TYPE_CHECKING`, try/except imports
            inner = [
                *node.body,
                *getattr(node, "orelse", []),
                *[s for h in getattr(node, "handlers", []) for s in h.body],
            ]
            found = found or _defines(inner, name)
    return found


def check_function(target: str, main_source: Path | None = None, env: dict[str, str] | None = None) -> str | None:
    """None when `pkg.mod:Qual.name` resolves statically; else why not (one line)."""
    module, _, qual = target.partition(":")
    if not module or not qual:
        return f"{target!r} is not pkg.mod:Qual.name"
    if module == "__main__":
        if main_source is None:
            return f"{target}: the command runs no Python script hctool can read, so __main__ names nothing"
        src = main_source
    else:
        src = module_source(module, main_source, env)
        if src is None:
            return f"{target}: no module {module!r} on the job's path"
    try:
        tree = ast.parse(src.read_text(encoding="utf-8", errors="replace"), str(src))
    except (OSError, SyntaxError) as exc:
        return f"{target}: cannot read {src}: {exc}"
    body, where = tree.body, str(src)
    parts = qual.split(".")
    for k, part in enumerate(parts):
        node = _defines(body, part)
        if node is None:
            missing = ".".join(parts[: k + 1])
            return (
                f"{target}: {src.name} defines no {missing!r} "
                f"(looked for a def, class, assignment or import in {where})"
            )
        if k < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                return f"{target}: {'.'.join(parts[: k + 1])} in {src.name} is not a class"
            body = node.body
    return None

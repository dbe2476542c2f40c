"""Per-file work, run in worker processes: pass 1 summarizes, pass 2 finds and suppresses."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field

from hctool.lint import names as N
from hctool.lint import receivers as R
from hctool.lint.checks import Finding, check_comparison, check_function
from hctool.lint.config import LintConfig
from hctool.lint.project import FuncSummary, ModuleSummary, Project
from hctool.lint.rules import RULES
from hctool.lint.source import read_source
from hctool.lint.walker import EMPTY, FnAtom, ModuleInfo, ParamAtom, Walker

SUPPRESS_RE = re.compile(r"#\s*hctool:\s*ignore\[([^\]]*)\]")
_COMPOUND = (ast.If, ast.Try, ast.With, ast.For, ast.While)


@dataclass
class FileResult:
    findings: list = field(default_factory=list)
    error: tuple | None = None  # (line, message)


def _functions(tree: ast.Module) -> list[tuple]:
    """(node, enclosing class, qualified name) for every def, nested ones included."""
    out = []

    def visit(body, cls, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, node.name, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((node, cls, prefix + node.name))
                visit(node.body, cls, f"{prefix}{node.name}.")
            elif isinstance(node, _COMPOUND) or type(node).__name__ == "TryStar":
                for part in ("body", "orelse", "finalbody"):
                    visit(getattr(node, part, []), cls, prefix)
                for h in getattr(node, "handlers", []):
                    visit(h.body, cls, prefix)

    visit(tree.body, None, "")
    return out


def _module_info(tree: ast.Module, path: str, modname: str, cfg: LintConfig) -> ModuleInfo:
    defs = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.add(node.name)
    return ModuleInfo(path, modname, N.import_map(tree, modname), frozenset(defs),
                      cfg.collectives, cfg.rank_local, (cfg.uniform | N.DEFAULT_UNIFORM) - cfg.rank_local)


def _parse(file: str) -> tuple[bytes, ast.Module]:
    data = read_source(file)  # never a FIFO, a followed link or an unbounded read (source.py)
    return data, ast.parse(data, filename=file)


def _error(exc: BaseException) -> tuple:
    if isinstance(exc, SyntaxError):
        return (exc.lineno or 1, f"syntax error: {exc.msg}")
    if isinstance(exc, OSError):
        return (1, f"cannot read: {exc.strerror or exc}")
    return (1, f"{type(exc).__name__}: {exc}")


def summarize_file(file: str, path: str, modname: str, cfg: LintConfig) -> ModuleSummary:
    summary = ModuleSummary(path, modname)
    try:
        data, tree = _parse(file)
        summary.lines = data.count(b"\n") + 1
        summary.wants_check = b"hctool:" in data
        mod = _module_info(tree, path, modname, cfg)
        for node, cls, qual in _functions(tree):
            key = f"{path}:{qual}"
            w = Walker(mod, None, cls, key=key).run(node)
            summary.wants_check |= w.saw_ordering
            if node.name == "__init__":
                summary.init_params[key] = [a.arg for a in (*node.args.posonlyargs, *node.args.args)][1:]
            summary.funcs.append(FuncSummary(key, qual, path, node.lineno, w.direct, w.calls, w.ret,
                                             w.mode_exit))
            if cls:  # fields are keyed by their class: `self.rank` elsewhere is another field
                for name, atoms in w.attr_assigns.items():
                    summary.attr_assigns[(cls, name)] = summary.attr_assigns.get((cls, name), EMPTY) | atoms
                for name, specs in w.field_types.items():
                    summary.field_types[(cls, name)] = summary.field_types.get((cls, name), EMPTY) | specs
            is_property = any(N.dotted(d) in ("property", "functools.cached_property", "cached_property")
                              for d in node.decorator_list)
            if is_property and cls:
                k = (cls, node.name)
                summary.attr_assigns[k] = summary.attr_assigns.get(k, EMPTY) | {FnAtom(key)}
            if node.name in N.COMPARISON_DUNDERS:
                summary.wants_check = True
            if cls is None and "." not in qual:
                summary.module_funcs[node.name] = key
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [N.qualify(N.dotted(b), mod.imports) for b in node.bases]
                methods = {n.name: f"{path}:{node.name}.{n.name}" for n in node.body
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                summary.classes[node.name] = ([b for b in bases if b], methods)
                init_key = f"{path}:{node.name}.__init__"
                for item in node.body:  # dataclass / NamedTuple fields: `tree_cache: BasePrefixCache`
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        if "__init__" not in methods:  # the generated constructor stores its arguments
                            k = (node.name, item.target.id)
                            summary.attr_assigns[k] = summary.attr_assigns.get(k, EMPTY) | {ParamAtom(init_key, k[1])}
                            summary.init_params.setdefault(init_key, []).append(k[1])
                        specs = R.annotation(item.annotation, mod.imports, modname, mod.local_defs)
                        if specs:
                            k = (node.name, item.target.id)
                            summary.field_types[k] = summary.field_types.get(k, EMPTY) | specs
    except (SyntaxError, ValueError, OSError, RecursionError, MemoryError) as exc:
        summary.error = _error(exc)
        summary.funcs, summary.classes, summary.module_funcs, summary.attr_assigns = [], {}, {}, {}
        summary.field_types, summary.init_params = {}, {}
    return summary


def suppressions(text: str) -> dict[int, tuple[int, set[str]]]:
    """line -> (column, codes) for each `# hctool: ignore[...]` comment."""
    out = {}
    if "hctool:" not in text:
        return out
    for lineno, col, comment in _comments(text):
        m = SUPPRESS_RE.search(comment)
        if m:
            codes = {c.strip().upper() for c in m.group(1).split(",") if c.strip()}
            out[lineno] = (col + m.start() + 1, codes)
    return out


def _comments(text: str):
    """(line, column, text) of each real comment: the same words inside a string or a
    docstring (documentation of the syntax, say) suppress nothing."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.start[1], tok.string
    except (tokenize.TokenError, SyntaxError):
        return


def apply_suppressions(findings: list[Finding], text: str, path: str, select: frozenset) -> list[Finding]:
    table = suppressions(text)
    used: set[tuple[int, str]] = set()
    kept = []
    for f in findings:
        hit = next((ln for ln in range(f.line, max(f.line, f.end_line) + 1)
                    if ln in table and f.rule in table[ln][1]), None)
        if hit is None:
            kept.append(f)
        else:
            used.add((hit, f.rule))
    if "HC100" in select:
        for line, (col, codes) in sorted(table.items()):
            for code in sorted(codes):
                if (line, code) not in used and (code in select or code not in RULES):
                    kept.append(Finding(path, line, col, "HC100",
                                        f"unused suppression `ignore[{code}]`: no {code} finding on this line", [], line,
                                        "low"))
    return kept


def check_file(file: str, path: str, modname: str, cfg: LintConfig, project: Project) -> FileResult:
    result = FileResult()
    try:
        data, tree = _parse(file)
        mod = _module_info(tree, path, modname, cfg)
        findings: list[Finding] = []
        for node, cls, qual in _functions(tree):
            w = Walker(mod, project, cls).run(node)
            found = check_function(w, path)
            if node.name in N.COMPARISON_DUNDERS and cls and project.program_has_collectives(modname):
                found += check_comparison(w, path, qual, node.lineno, node.col_offset + 1)
            for f in found:
                f.function = qual
            findings += found
        if not project.program_has_collectives(modname):  # HC104 is about replicated state
            findings = [f for f in findings if f.rule != "HC104"]
        unique = {}
        for f in sorted(findings):
            unique.setdefault((f.rule, f.line, f.col, f.message), f)
        selected = [f for f in unique.values() if f.rule in cfg.select]
        text = data.decode("utf-8", errors="replace")
        result.findings = sorted(apply_suppressions(selected, text, path, cfg.select))
    except (SyntaxError, ValueError, OSError, RecursionError, MemoryError) as exc:
        result.error = _error(exc)
    return result


"""Per-file work, run in worker processes: pass 1 summarizes, pass 2 finds and suppresses."""

from __future__ import annotations

import ast
import errno
import io
import re
import tokenize
from dataclasses import dataclass, field

from hctool.lint import bounded
from hctool.lint import names as N
from hctool.lint import receivers as R
from hctool.lint.cache import Recorder, digest
from hctool.lint.checks import Finding, Relation, check_function
from hctool.lint.config import LintConfig
from hctool.lint.latches import latch_properties
from hctool.lint.project import FuncSummary, ModuleSummary, Project
from hctool.lint.rules import RULES
from hctool.lint.source import read_source
from hctool.lint.walker import EMPTY, FnAtom, ModuleInfo, ParamAtom, Walker  # noqa: F401

SUPPRESS_RE = re.compile(r"#\s*hctool:\s*ignore\[([^\]]*)\]")
# ruff's and flake8's form: `noqa`, a colon, then codes separated by commas or spaces. Only HC codes
# are ours: a comment naming E501 and HC102 suppresses HC102 and leaves E501 to the other linter. A bare
# `noqa` names no code and suppresses no hctool finding (it is usually written for another linter).
NOQA_RE = re.compile(r"#\s*noqa\s*:\s*([A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*)", re.IGNORECASE)
HC_CODE = re.compile(r"^HC[0-9]{3}$")
NOQA_HC = re.compile(rb"(?i)noqa\s*:[^\n]*HC[0-9]")
_COMPOUND = (ast.If, ast.Try, ast.With, ast.For, ast.While)
# Statements that hold no others, hence no def (most of a module): _functions passes them at once.
_SIMPLE = frozenset(
    {
        ast.Expr,
        ast.Assign,
        ast.AnnAssign,
        ast.AugAssign,
        ast.Return,
        ast.Pass,
        ast.Import,
        ast.ImportFrom,
        ast.Raise,
        ast.Assert,
        ast.Delete,
        ast.Global,
        ast.Nonlocal,
        ast.Break,
        ast.Continue,
    }
)


def _may_noqa(data: bytes) -> bool:
    """NOQA_HC.search(data), with the case-insensitive regex run only where `noqa` is (ASCII case folding,
    as the regex's on bytes): scanning every file with it cost more than the rest of the text checks."""
    return b"noqa" in data.lower() and NOQA_HC.search(data) is not None


@dataclass
class FileResult:
    relations: list = field(default_factory=list)
    used: set = field(default_factory=set)  # (line, code) of suppression comments that matched
    error: tuple | None = None  # (line, message)
    digest: str = ""  # of the bytes analyzed (the cache key)
    answers: list = field(default_factory=list)  # project facts asked, with answers (cache.Recorder)
    walked: tuple = ()  # the functions analyzed (those that issue collectives or set state on a deadline)
    program: bool = False  # whether its program issues collectives (HC104 counts only there)


def _functions(tree: ast.Module, path: str) -> list[tuple]:
    """(node, enclosing class, qualified name, key) for every def, nested ones included. A name
    defined again (a property's setter, `def f` in both arms of an `if`) is a function of its own,
    keyed `path:qual@line`; references by name resolve to the first definition."""
    out: list = []
    _visit_defs(tree.body, None, "", path, out, set())
    return out


def _visit_defs(body: list, cls, prefix: str, path: str, out: list, seen: set) -> None:
    # A module-level function, not a closure that calls itself: that closure and its cell form a cycle
    # holding every def's tree, which the run (with the cyclic collector off, runner.lint) never freed.
    for node in body:
        if type(node) in _SIMPLE:
            continue
        if isinstance(node, ast.ClassDef):
            _visit_defs(node.body, node.name, f"{prefix}{node.name}.", path, out, seen)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            qual = prefix + node.name
            out.append((node, cls, qual, f"{path}:{qual}" if qual not in seen else f"{path}:{qual}@{node.lineno}"))
            seen.add(qual)
            _visit_defs(node.body, cls, f"{qual}.", path, out, seen)
        elif isinstance(node, _COMPOUND) or type(node).__name__ == "TryStar":
            for part in ("body", "orelse", "finalbody"):
                _visit_defs(getattr(node, part, []), cls, prefix, path, out, seen)
            for h in getattr(node, "handlers", []):
                _visit_defs(h.body, cls, prefix, path, out, seen)


def _module_info(tree: ast.Module, path: str, modname: str, cfg: LintConfig) -> ModuleInfo:
    defs = set()
    props = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.add(node.name)
        if isinstance(node, ast.ClassDef):
            found = latch_properties(node)
            if found:
                props[node.name] = found
    return ModuleInfo(
        path,
        modname,
        N.import_map(tree, modname),
        frozenset(defs),
        cfg.collectives,
        cfg.rank_local,
        (cfg.uniform | N.DEFAULT_UNIFORM) - cfg.rank_local,
        props,
    )


def _error(exc: BaseException) -> tuple:
    if isinstance(exc, SyntaxError):
        return (exc.lineno or 1, f"syntax error: {exc.msg}")
    if isinstance(exc, MemoryError):
        return (1, "out of memory while parsing it")
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return (1, exc.strerror)
    if isinstance(exc, OSError):
        return (1, f"cannot read: {exc.strerror or exc}")
    return (1, f"{type(exc).__name__}: {exc}")


def summarize_file(file: str, path: str, modname: str, cfg: LintConfig) -> ModuleSummary:
    try:
        data = read_source(file)  # never a FIFO, a followed link or an unbounded read (source.py)
        if bounded.needs_bound(len(data)):  # its tree could outgrow the memory budget: parse it in a child
            return bounded.call(_summarize, (file, data, path, modname, cfg), cfg.memory_mib)
        return _summarize(file, data, path, modname, cfg)
    except (OSError, MemoryError) as exc:
        summary = ModuleSummary(path, modname)
        summary.error = _error(exc)
        return summary


def _summarize(file: str, data: bytes, path: str, modname: str, cfg: LintConfig) -> ModuleSummary:
    summary = ModuleSummary(path, modname)
    try:
        tree = ast.parse(data, filename=file)
        summary.digest = digest(data)
        summary.lines = data.count(b"\n") + 1
        if b"hctool:" in data or _may_noqa(data):  # tokenizing for comments is slow: only where one may be
            summary.suppressions = suppressions(data.decode("utf-8", errors="replace"))
        mod = _module_info(tree, path, modname, cfg)
        summary.imports, summary.local_defs, summary.latch_props = mod.imports, mod.local_defs, mod.latch_props
        for node, cls, qual, key in _functions(tree, path):
            w = Walker(mod, None, cls, key=key, qual=qual).run(node)
            if node.name == "__init__":
                summary.init_params[key] = [a.arg for a in (*node.args.posonlyargs, *node.args.args)][1:]
            summary.funcs.append(
                FuncSummary(
                    key,
                    qual,
                    path,
                    node.lineno,
                    w.direct,
                    w.calls,
                    w.ret,
                    w.mode_exit,
                    (modname, cls) if cls else None,
                    w.direct_latch,
                    tuple(sorted(w.latch_assigned)),
                    tuple(w.spawns),
                    tuple(w.writes),
                    bool(w.state_writes),
                    cls,
                    (min([d.lineno for d in node.decorator_list] + [node.lineno]), node.end_lineno or node.lineno),
                    w.receives,
                    w.direct_dims,
                    tuple(w.frees),
                    tuple(w.gated_refs),
                    tuple(w.id_writes),
                    tuple(w.id_calls),
                )
            )
            if cls:  # fields are keyed by their class: `self.rank` elsewhere is another field
                for name, atoms in w.attr_assigns.items():
                    summary.attr_assigns[(cls, name)] = summary.attr_assigns.get((cls, name), EMPTY) | atoms
                for name, specs in w.field_types.items():
                    summary.field_types[(cls, name)] = summary.field_types.get((cls, name), EMPTY) | specs
            is_property = any(
                N.dotted(d) in ("property", "functools.cached_property", "cached_property") for d in node.decorator_list
            )
            if is_property and cls:
                k = (cls, node.name)
                summary.attr_assigns[k] = summary.attr_assigns.get(k, EMPTY) | {FnAtom(key)}
            if cls is None and "." not in qual:
                summary.module_funcs.setdefault(node.name, key)
        summary.actors = _ray_actors(tree, mod.imports)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [N.qualify(N.dotted(b), mod.imports) for b in node.bases]
                methods = {
                    n.name: f"{path}:{node.name}.{n.name}"
                    for n in node.body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
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
    except (SyntaxError, ValueError, OSError, RecursionError) as exc:  # MemoryError: see bounded.py
        summary.error = _error(exc)
        summary.funcs, summary.classes, summary.module_funcs, summary.attr_assigns = [], {}, {}, {}
        summary.field_types, summary.init_params = {}, {}
    return summary


def _ray_actors(tree: ast.Module, imports: dict) -> tuple:
    """Top-level classes made Ray actors in this module: decorated `@ray.remote` / `@ray.remote(...)`, or
    wrapped `ray.remote(Cls)` / `ray.remote(...)(Cls)` at module level."""

    def is_remote(expr) -> bool:
        func = expr.func if isinstance(expr, ast.Call) else expr
        return N.qualify(N.dotted(func), imports) == "ray.remote"

    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(is_remote(d) for d in node.decorator_list):
            out.append(node.name)
        value = node.value if isinstance(node, (ast.Assign, ast.Expr)) else None
        if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Name):
            if is_remote(value.func) or is_remote(value):
                out.append(value.args[0].id)
    return tuple(out)


def suppressions(text: str) -> dict[int, tuple[int, set[str], str]]:
    """line -> (column, codes, form) for each `# hctool: ignore[...]` or `# noqa: HCnnn` comment;
    FORM ("ignore" or "noqa") is how HC100 names a stale one."""
    out: dict = {}
    if "hctool:" not in text and not _may_noqa(text.encode("utf-8", errors="replace")):
        return out
    for lineno, col, comment in _comments(text):
        m = SUPPRESS_RE.search(comment)
        if m:
            codes = {c.strip().upper() for c in m.group(1).split(",") if c.strip()}
            out[lineno] = (col + m.start() + 1, codes, "ignore")
        n = NOQA_RE.search(comment)
        if n:
            codes = {c.upper() for c in re.split(r"[\s,]+", n.group(1)) if HC_CODE.match(c.upper())}
            if codes:
                prev = out.get(lineno)
                out[lineno] = (prev[0], prev[1] | codes, prev[2]) if prev else (col + n.start() + 1, codes, "noqa")
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


def suppress(relations: list[Relation], table: dict, used: set) -> list[Relation]:
    """Drop relations whose statement carries `# hctool: ignore[RULE]`; note the comments used."""
    kept = []
    for r in relations:
        hit = next(
            (ln for ln in range(r.line, max(r.line, r.end_line) + 1) if ln in table and r.rule in table[ln][1]), None
        )
        if hit is None:
            kept.append(r)
        else:
            used.add((hit, r.rule))
    return kept


def unused_suppressions(path: str, table: dict, used: set, select: frozenset) -> list[Finding]:
    out = []
    for line, (col, codes, *form) in sorted(table.items()):
        for code in sorted(codes):
            if (line, code) not in used and (code in select or code not in RULES):
                comment = f"noqa: {code}" if form and form[0] == "noqa" else f"ignore[{code}]"
                out.append(
                    Finding(
                        path,
                        line,
                        col,
                        "HC100",
                        f"unused suppression `{comment}`: no {code} finding on this line",
                        [],
                        line,
                        "low",
                    )
                )
    return out


def walked(project: Project, keys) -> tuple:
    """The functions pass 2 analyzes: those that issue collectives or set state under a deadline."""
    return tuple(k for k in keys if k in project.coll or k in project.checked)


def check_file(file: str, path: str, modname: str, cfg: LintConfig, project: Project) -> FileResult:
    """Pass 2: the relations of the functions that issue collectives (the only ones that can gate one).
    Only those functions are parsed again, from their lines: a tenth of what the files hold in srt."""
    try:
        data = read_source(file)
        if bounded.needs_bound(len(data)):
            return bounded.call(_check, (file, data, path, modname, cfg, project), cfg.memory_mib)
        return _check(file, data, path, modname, cfg, project)
    except (OSError, MemoryError) as exc:
        return FileResult(error=_error(exc))


def _check(file: str, data: bytes, path: str, modname: str, cfg: LintConfig, project: Project) -> FileResult:
    result = FileResult()
    facts = Recorder(project)
    summary = project.modules[path]
    try:
        result.digest = digest(data)
        funcs = {f.key: f for f in summary.funcs}
        result.walked = walked(project, list(funcs))
        todo = None
        if result.digest == summary.digest:
            mod = ModuleInfo(
                path,
                modname,
                summary.imports,
                summary.local_defs,
                cfg.collectives,
                cfg.rank_local,
                (cfg.uniform | N.DEFAULT_UNIFORM) - cfg.rank_local,
                summary.latch_props,
            )
            encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
            lines = data.splitlines(keepends=True)
            try:
                todo = [
                    (_function_node(lines, funcs[k].span, encoding), funcs[k].cls, funcs[k].qual, k)
                    for k in result.walked
                ]
            except SyntaxError:  # a decorator's `@` above the line its expression starts on: `@(\n deco)`
                todo = None
        if todo is None:  # the file changed since pass 1, or a def does not parse alone: the whole file
            tree = ast.parse(data, filename=file)
            mod = _module_info(tree, path, modname, cfg)
            chosen = set(result.walked)
            todo = [t for t in _functions(tree, path) if t[3] in chosen]
        relations: list[Relation] = []
        for node, cls, qual, key in todo:
            w = Walker(mod, facts, cls, key=key, qual=qual).run(node)
            relations += check_function(w, path)
        result.program = project.program_has_collectives(modname)
        if not result.program:  # HC104 is about replicated state
            relations = [r for r in relations if r.rule != "HC104"]
        relations = [r for r in relations if r.rule in cfg.select]
        if relations and summary.suppressions:
            relations = suppress(relations, summary.suppressions, result.used)
        result.relations = relations
        result.answers = facts.answers()
    except (SyntaxError, ValueError, OSError, RecursionError) as exc:  # MemoryError: see bounded.py
        result.error = _error(exc)
    return result


def _function_node(lines: list, span: tuple, encoding: str):
    """The def at SPAN (decorators to its last line), parsed alone at its own line numbers and columns:
    an indented def parses under an `if 1:` header, which keeps its indentation valid. Blank lines
    ahead of it put it at its own line numbers: the parser skips them for next to nothing, where
    ast.increment_lineno walked every node again (a tenth of pass 2 on SGLang's srt)."""
    first, last = span
    text = b"".join(lines[first - 1 : last]).decode(encoding, errors="replace")
    if text[:1] in (" ", "\t"):
        if first >= 2:
            return ast.parse("\n" * (first - 2) + "if 1:\n" + text).body[0].body[0]
        node = ast.parse("if 1:\n" + text).body[0].body[0]
        ast.increment_lineno(node, first - 2)
        return node
    return ast.parse("\n" * (first - 1) + text).body[0]

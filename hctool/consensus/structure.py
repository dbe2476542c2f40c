"""The program's own structure, read from its source: which loop or branch a call sits in.

Two ranks' traces alone cannot always say which rank deviated: rank 0 repeating the loop's
all_reduce while rank 1 waits in a barrier reads the same whether rank 1's barrier sits
inside the loop (rank 1 branched into an extra call) or after it (rank 1 left the loop and
rank 0 took one more turn). The call stacks name files and lines; this module reads those
files (Python's own parser: nothing is run) and answers the questions blame.py asks:

- which compound statements enclose a line (loops, branches, try/except), up to its function;
- the innermost loop a call repeats in, looking out through its callers;
- whether the other rank is still inside that loop;
- whether a loop can be left or a call skipped early, and whether what decides it looks
  rank-local (a clock, a poll, a rank id, an exception): the difference between "this rank
  left its loop early" and "its peer had one more item to process".

Files named in a trace may come from anyone: only regular `.py` files of at most 4 MiB are
read (no FIFO, no link to a device), parsed once per analysis, at most 256 of them.
"""

from __future__ import annotations

import ast
import os
import sysconfig
from typing import NamedTuple

from hctool.lint import names as N
from hctool.protocol.safefile import read_regular

MAX_SOURCE = 4 << 20
MAX_FILES = 256
# Names and calls whose value differs between ranks (the linter's source vocabulary, hctool/lint/names.py):
# a loop exit or a skip decided by one of them is a decision this rank made on its own.
_RANK_LOCAL_CALLS = (
    {c.rsplit(".", 1)[-1] for c in N.CLOCK_CALLS}
    | set(N.RANK_CALLS)
    | set(N.RANK_LOCAL_METHODS)
    | {
        "is_set",
        "done",
        "poll",
        "empty",
        "exists",
        "isfile",
        "is_file",
        "random",
        "randint",
        "uniform",
        "choice",
        "getmtime",
        "stat",
        "gethostname",
        "getpid",
    }
)
_RANK_LOCAL_WORDS = ("deadline", "elapsed", "budget", "timeout", "time_left", "last_ckpt", "last_save")


class Frame(NamedTuple):
    path: str
    line: int
    fn: str


class Block(NamedTuple):
    kind: str  # "loop" | "while" | "if" | "else" | "try" | "except" | "def"
    start: int  # first line of the block's own lines (a loop: its header)
    end: int  # last line
    node: ast.AST | None = None

    def holds(self, line: int) -> bool:
        return self.start <= line <= self.end


class Exit(NamedTuple):
    how: str  # "break" | "continue" | "return" | "raise" | "test" (a while loop's own test)
    line: int
    rank_local: bool  # what decides it looks rank-local (see _rank_local)
    why: str  # the deciding condition, in source text ("except OSError", "time.monotonic() > t")


def frames_of(ev: dict) -> list[Frame]:
    """The call's stack, outermost first ("path:LINE fn" entries are recorded innermost first)."""
    out = []
    for s in reversed(ev.get("stack") or ()):
        where, _, fn = s.partition(" ")
        path, _, line = where.rpartition(":")
        if path and line.isdigit():
            out.append(Frame(path, int(line), fn))
    return out


def common_level(fa: list[Frame], fb: list[Frame]) -> tuple[int, int] | None:
    """Indices (ia, ib) of the frames where two calls' paths part inside one function: the same
    function, entered from the same caller lines as far as both stacks go, at different lines
    (or the same line: two calls of one statement). None when they share no function."""
    best = None
    for ia in range(len(fa) - 1, -1, -1):
        for ib in range(len(fb) - 1, -1, -1):
            a, b = fa[ia], fb[ib]
            if (a.path, a.fn) != (b.path, b.fn):
                continue
            k = 1
            while k <= min(ia, ib) and fa[ia - k] == fb[ib - k]:
                k += 1
            if k > min(ia, ib) and (best is None or ia + ib > sum(best)):
                best = (ia, ib)
    return best


class SourceMap:
    """Parsed sources, by path, for one analysis (bounded; unreadable files are None)."""

    def __init__(self) -> None:
        self._files: dict[str, list[Block] | None] = {}

    def blocks(self, path: str) -> list[Block] | None:
        if path in self._files:
            return self._files[path]
        out = None
        if len(self._files) < MAX_FILES and path.endswith(".py") and os.path.isabs(path) and not _library(path):
            try:
                out = _blocks(ast.parse(read_regular(path, MAX_SOURCE)))
            except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
                out = None
        self._files[path] = out
        return out

    def enclosing(self, frame: Frame) -> list[Block] | None:
        """The blocks around a frame's line, outermost first, from its innermost function on."""
        blocks = self.blocks(frame.path)
        if blocks is None:
            return None
        around = [b for b in blocks if b.holds(frame.line)]
        defs = [i for i, b in enumerate(around) if b.kind == "def"]
        return around[defs[-1] + 1 :] if defs else around

    def innermost_loop(self, frames: list[Frame]) -> tuple[int, Block] | None:
        """(frame index, loop) of the innermost loop a call sits in, looking out through its callers."""
        for i in range(len(frames) - 1, -1, -1):
            around = self.enclosing(frames[i])
            if around is None:
                return None
            loops = [b for b in around if b.kind in ("loop", "while")]
            if loops:
                return i, loops[-1]
        return None

    def loops_left(self, fx: list[Frame], fy: list[Frame] | None) -> tuple[int, Block, list[Block]] | None:
        """The loop the call with stack fx repeats in and the other call (fy; None: the other rank
        ended) is past: (frame index, the loop, every loop from it in to the call). The loop is
        found where the two paths part: a loop of their common function around fx's line but not
        fy's; else, when fx is down in a callee fy is not in, the outermost loop below (a whole
        turn of it holds the inner loops' turns). None: no such loop, or the source is not known."""
        if fy is not None:
            lvl = common_level(fx, fy)
            if lvl is None:
                return None
            ca, cb = lvl
            around = self.enclosing(fx[ca])
            if around is None:
                return None
            outs = [b for b in around if b.kind in ("loop", "while") and not b.holds(fy[cb].line)]
            if outs:
                return ca, outs[0], outs + self._loops_below(fx, ca + 1)
            if fx[ca].line == fy[cb].line or ca == len(fx) - 1:
                return None  # one statement, or fx's call is in the common function itself: not a loop exit
            start = ca + 1
        else:
            start = 0
        for i in range(start, len(fx)):
            around = self.enclosing(fx[i])
            if around is None:
                continue  # a library frame above the program's own (threading's bootstrap, a runner)
            loops = [b for b in around if b.kind in ("loop", "while")]
            if loops:
                return i, loops[0], loops + self._loops_below(fx, i + 1)
        return None

    def _loops_below(self, fx: list[Frame], start: int) -> list[Block]:
        out = []
        for i in range(start, len(fx)):
            out += [b for b in (self.enclosing(fx[i]) or ()) if b.kind in ("loop", "while")]
        return out

    def conditional(self, frames: list[Frame], start: int, other_line: int | None) -> Block | None:
        """The innermost branch (if/else/except body) around the call, in frames[start:] (the
        frame where the two paths part, then the callees), that does not also hold the other
        rank's line in frames[start]. None when the call is on an unconditional path."""
        found = None
        for i in range(start, len(frames)):
            around = self.enclosing(frames[i])
            if around is None:
                return found
            for b in around:
                if b.kind in ("if", "else", "except") and not (
                    i == start and other_line is not None and b.holds(other_line)
                ):
                    found = b
        return found

    def early_returns(self, frame: Frame) -> list[Exit]:
        """Guarded returns (and raises) of the frame's function before its line: ways a call of
        this function can skip the call it made at that line (a poll that returns early)."""
        blocks = self.blocks(frame.path)
        if blocks is None:
            return []
        defs = [
            b
            for b in blocks
            if b.kind == "def" and b.holds(frame.line) and b.node is not None and not isinstance(b.node, ast.Lambda)
        ]
        if not defs:
            return []
        fn = max(defs, key=lambda b: b.start).node
        out = []
        for stmt, guards in _walk_guarded(fn.body, []):
            if isinstance(stmt, (ast.Return, ast.Raise)) and guards and stmt.lineno < frame.line:
                g = guards[-1]
                local = isinstance(g, ast.ExceptHandler) or not _uniform(g, set())
                why = f"except {_text(g.type)}".strip() if isinstance(g, ast.ExceptHandler) else _text(g)
                out.append(Exit("return" if isinstance(stmt, ast.Return) else "raise", stmt.lineno, local, why))
        return out

    def caught(self, frame: Frame) -> list[Exit]:
        """The frame's line sits in a try body whose handler catches: an exception raised before it
        (on one rank: an OOM, a missing file) skips the call, and the handler goes on."""
        around = self.enclosing(frame) or []
        out = []
        for b in around:
            if b.kind == "try" and b.node is not None:
                for h in b.node.handlers:
                    if not (
                        h.body and isinstance(h.body[-1], ast.Raise) and h.body[-1].exc is None and len(h.body) == 1
                    ):
                        out.append(Exit("except", h.lineno, True, f"except {_text(h.type)}".strip()))
        return out

    def exits(self, loop: Block) -> list[Exit]:
        """How a loop can end early or skip the rest of a turn, and what decides each way."""
        if loop.node is None or not isinstance(loop.node, (ast.For, ast.AsyncFor, ast.While)):
            return []
        out: list[Exit] = []
        node = loop.node
        if isinstance(node, ast.While) and not (isinstance(node.test, ast.Constant) and node.test.value):
            out.append(Exit("test", node.lineno, not _uniform(node.test, set()), _text(node.test)))
        for stmt, guards in _walk_guarded(node.body, []):
            how = {ast.Break: "break", ast.Continue: "continue", ast.Return: "return", ast.Raise: "raise"}.get(
                type(stmt)
            )
            if how is None:
                continue
            if not guards:
                continue  # unconditional: every rank takes it at the same point of the turn
            g = guards[-1]
            local = isinstance(g, ast.ExceptHandler) or not _uniform(g, _targets(node))
            why = (
                f"except {_text(g.type) if g.type is not None else ''}".strip()
                if isinstance(g, ast.ExceptHandler)
                else _text(g)
            )
            out.append(Exit(how, stmt.lineno, local, why))
        return out


# Frames of the machinery a program runs on (the standard library, torch and its compilers, hctool):
# their loops and early returns are not the program's decisions (dynamo's compile wrapper returns
# early on every traced call).
_STDLIB = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib") if k in sysconfig.get_paths()})
_LIBRARY_PARTS = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}hctool{os.sep}",
    f"{os.sep}triton{os.sep}",
    f"{os.sep}numpy{os.sep}",
    f"{os.sep}functorch{os.sep}",
)


def _library(path: str) -> bool:
    if path.startswith(_STDLIB) and "-packages" not in path:  # the standard library, not what is installed beside it
        return True
    return any(p in path for p in _LIBRARY_PARTS)


def _shares_outer(fa: list[Frame], ia: int, fb: list[Frame]) -> bool:
    """fb agrees with fa on the frames outside frame ia (the same callers), as far as both go."""
    k = 0
    while k < ia and k < len(fb) and fa[k] == fb[k]:
        k += 1
    return k == ia or k == len(fb)


def _walk_guarded(body: list, guards: list, in_loop: bool = False):
    """Statements of a loop body with the conditions that guard them (If tests, except
    handlers), not entering nested functions; break/continue of a nested loop are its own."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, (ast.Break, ast.Continue)) and in_loop:
            continue
        yield stmt, guards
        if isinstance(stmt, ast.If):
            yield from _walk_guarded(stmt.body, guards + [stmt.test], in_loop)
            yield from _walk_guarded(stmt.orelse, guards + [stmt.test], in_loop)
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            yield from _walk_guarded(stmt.body, guards, True)
            yield from _walk_guarded(stmt.orelse, guards, in_loop)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            yield from _walk_guarded(stmt.body, guards, in_loop)
            for h in stmt.handlers:
                yield from _walk_guarded(h.body, guards + [h], in_loop)
            yield from _walk_guarded(stmt.orelse, guards, in_loop)
            yield from _walk_guarded(stmt.finalbody, guards, in_loop)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from _walk_guarded(stmt.body, guards, in_loop)
        elif type(stmt).__name__ == "Match":
            for case in stmt.cases:
                yield from _walk_guarded(case.body, guards + [stmt.subject], in_loop)


_COUNTERS = {
    "i",
    "j",
    "k",
    "n",
    "t",
    "it",
    "step",
    "steps",
    "epoch",
    "epochs",
    "iteration",
    "iterations",
    "iter",
    "global_step",
    "n_iter",
    "batch_idx",
    "idx",
    "count",
    "turn",
    "round",
    "tick",
}
_CONFIG_ROOTS = {"args", "cfg", "config", "conf", "opt", "opts", "hparams", "settings", "params", "flags", "FLAGS"}
_PURE_CALLS = {"int", "float", "bool", "min", "max", "abs", "round", "divmod"}


def _targets(loop: ast.AST) -> set[str]:
    target = getattr(loop, "target", None)
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target is not None else set()


def _uniform(expr: ast.AST, targets: set[str]) -> bool:
    """Whether a condition is the same on every rank by its look: loop counters, constants and
    configuration only (`step >= args.max_steps`, `i % 10 == 0`). Anything else (data, a clock,
    a poll, a helper's answer) may differ between ranks: a loop that ends or skips on it is a
    decision each rank makes on its own."""
    if _rank_local(expr):
        return False
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            f = node.func
            if not (isinstance(f, ast.Name) and f.id in _PURE_CALLS):
                return False
        elif isinstance(node, ast.Name):
            if not (
                node.id in targets
                or node.id in _COUNTERS
                or node.id.isupper()
                or node.id in _CONFIG_ROOTS
                or node.id == "self"
                or node.id.split("_", 1)[0] in ("max", "total", "min")
                or node.id in ("True", "False", "None")
            ):
                return False
        elif isinstance(node, ast.Attribute):
            root = node
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and (root.id in _CONFIG_ROOTS or root.id == "self"):
                chain = ast.unparse(node) if hasattr(ast, "unparse") else ""
                if root.id == "self" and not any(w in chain for w in ("config", "cfg", "args", "max_", "num_")):
                    return False
            else:
                return False
        elif isinstance(node, (ast.Subscript, ast.Await, ast.Lambda, ast.Starred)):
            return False
    return True


def _rank_local(expr: ast.AST) -> bool:
    for node in ast.walk(expr):
        name = None
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in _RANK_LOCAL_CALLS:
                return True
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        if name is not None and (name in N.RANK_VARIABLES or any(w in name.lower() for w in _RANK_LOCAL_WORDS)):
            return True
    return False


def _text(node: ast.AST | None) -> str:
    if node is None:
        return ""
    try:
        text = ast.unparse(node)
    except (ValueError, AttributeError, RecursionError):
        return "?"
    return text if len(text) <= 80 else text[:77] + "..."


def _span(body: list) -> tuple[int, int] | None:
    if not body:
        return None
    return body[0].lineno, max(getattr(s, "end_lineno", s.lineno) or s.lineno for s in body)


def _blocks(tree: ast.Module) -> list[Block]:
    """Every block of a module, as line spans (a branch's body and else are separate blocks; a
    loop's span is its header and body, not its else)."""
    out: list[Block] = []

    def add(kind: str, body: list, node=None, start: int | None = None) -> None:
        span = _span(body)
        if span is not None:
            out.append(Block(kind, start if start is not None else span[0], span[1], node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            out.append(Block("def", node.lineno, node.end_lineno or node.lineno, node))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            add("loop", node.body, node, node.lineno)
        elif isinstance(node, ast.While):
            add("while", node.body, node, node.lineno)
        elif isinstance(node, ast.If):
            add("if", node.body, node)
            add("else", node.orelse, node)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            if node.handlers:
                add("try", node.body, node)  # a call here is skipped when something before it raises
            for h in node.handlers:
                add("except", h.body, h)
            add("else", node.orelse, node)
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            # a comprehension is a loop of its own (its own frame, `<dictcomp>`): one call per item
            out.append(Block("loop", node.lineno, node.end_lineno or node.lineno, node))
    out.sort(key=lambda b: (b.start, -b.end))
    return out

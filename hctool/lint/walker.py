"""Forward taint analysis of one function body, shared by both passes.

Pass 1 (summaries) runs it with `facts=None`: unknown callees and attributes
stay symbolic (CallAtom, AttrAtom) so the project can solve them later. Pass 2
(findings) runs it with the solved project facts and records collective
events, exits and the control frames around them; checks.py turns those into
findings. Taint means "may differ between ranks".
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from hctool.lint import latches as L
from hctool.lint import names as N
from hctool.lint import receivers as R
from hctool.lint import sources as S
from hctool.lint.exprs import Expressions
from hctool.lint.observe import Observations, _intern
from hctool.lint.shapes import (  # noqa: F401  (re-exported for project.py, checks.py, analysis.py)
    EMPTY,
    AttrAtom,
    CallAtom,
    Collective,
    Exit,
    FnAtom,
    Frame,
    ModuleInfo,
    ParamAtom,
    Src,
    _drained_queue,
    _implicit,
    _matches,
    _mode_exit,
    _not_empty,
    _role_branch,
    _same_ops,
    _size_guard,
    _truthy_args,
)


@dataclass
class Walker(Expressions, Observations):
    mod: ModuleInfo
    facts: object | None  # project.Facts in pass 2
    cls: str | None = None
    env: dict = field(default_factory=dict)
    stack: list = field(default_factory=list)
    ctl: frozenset = EMPTY
    pos: int = 0
    quiet: bool = False
    collectives: list = field(default_factory=list)
    exits: list = field(default_factory=list)
    calls: list = field(default_factory=list)  # pass 1: (ref, line, display)
    direct: tuple | None = None  # pass 1: first direct collective (line, name)
    # pass 1: the parallel dimensions of its direct collectives' groups (exprs._call_dims)
    direct_dims: frozenset = frozenset()
    ret: frozenset = EMPTY
    attr_assigns: dict = field(default_factory=dict)
    orderings: list = field(default_factory=list)  # pass 2: (line, col, what, Src) for HC104
    types: dict = field(default_factory=dict)  # local name -> receiver specs (receivers.py)
    field_types: dict = field(default_factory=dict)  # pass 1: self.NAME -> specs assigned to it
    mode_exit: tuple | None = None  # (param, position): see _mode_exit
    key: str = ""  # this function's project key (pass 1: constructor parameters become ParamAtoms)
    qual: str = ""  # its qualified name: sources name the function they sit in
    latches: list = field(default_factory=list)  # pass 1: fields of the `if self.F is None:` arms we are in
    latch_assigned: set = field(default_factory=set)  # pass 1: latch fields this function sets in their arm
    direct_latch: str | None = None
    spawns: list = field(default_factory=list)  # pass 1: refs of functions handed to another thread
    writes: list = field(default_factory=list)  # pass 1: (receiver specs or None, field, line) it assigns
    fn_node: object = None
    items: set = field(default_factory=set)  # names bound by for-loops: items of a collection
    no_else: set = field(default_factory=set)  # ids of `elif`s no rank falls through (_cover_every_rank)
    # pass 2: the names each call is handed (an object a server or a callback may call back into: _arms)
    handed: list = field(default_factory=list)
    state_writes: list = field(default_factory=list)  # (pos, line, col, text, deadline Src): see _state_write
    item_of: dict = field(default_factory=dict)  # local -> the field whose items it iterates (`for t in op.transfers`)
    swallow: list = field(default_factory=list)  # pass 2: open try/suppress scopes that swallow failures (Swallow)
    receives: bool = False  # pass 1: it receives messages from another process (project.follows)
    sends: list = field(default_factory=list)  # pass 2: (pos, stack, names carried) of messages it sends
    frees: list = field(default_factory=list)  # pass 1: (pool field, under a per-rank condition, line)
    gated_refs: list = field(default_factory=list)  # pass 1: (ref, line, cause) it calls under a per-rank condition
    lag_lists: set = field(default_factory=set)  # pass 1: local lists filled under such a condition (`expired`)
    device_parts: dict = field(default_factory=dict)  # id(torch.device call) -> (type taint, index taint)
    id_cmps: dict = field(default_factory=dict)  # id(Compare) -> its taint, for comparisons of a rank id
    id_writes: list = field(default_factory=list)  # pass 1: (field, rank-id tests it runs under or None)
    id_calls: list = field(default_factory=list)  # pass 1: (ref, line, rank-id tests) of calls under rank-id tests
    name_keys: dict = field(default_factory=dict)  # pass 2: local -> [rank-id tests of each assignment, or None]
    # pass 2: id(condition) -> the kinds of the sources in its taint, for each `and`/`or` operand and
    # whole test it evaluated (paths.py holds fixed what does not vary with a decision's source)
    cond_kinds: dict = field(default_factory=dict)
    _assign_key: object = None  # the rank-id tests of the `name = value` being bound ("none": value is None)

    # ---- statements -------------------------------------------------------
    def run(self, fn: ast.AST) -> Walker:
        a = fn.args
        self.mode_exit = _mode_exit(fn)
        if self.facts is None and fn.name == "__init__" and self.key:
            # Fields a constructor stores take the taint of what its callers pass (PrefillAdder(budget)).
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs)[1:]:
                self.env[arg.arg] = frozenset((ParamAtom(self.key, arg.arg),))
        own = _own_rank_fields(fn, a)
        for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
            if arg.arg in own:
                # `def _add_peers(self, rank, peers)` reading `self.rank` too: the object's own rank is
                # `self.rank`, so the argument names another one (a peer, a loop over every rank).
                self.env[arg.arg] = EMPTY
            if arg.annotation is not None:
                specs = self._annotation(arg.annotation)
                if specs:
                    self.types[arg.arg] = specs
        self.fn_node = fn
        self.stmts(fn.body)
        return self

    def _annotation(self, node) -> frozenset:
        m = self.mod
        return R.annotation(node, m.imports, m.modname, m.local_defs)

    def type_of(self, node) -> frozenset:
        """Receiver specs of an expression: a typed local, `self`, a field, or a constructor call."""
        if isinstance(node, ast.Name):
            if node.id in ("self", "cls") and self.cls:
                return _intern(frozenset((("self", self.mod.modname, self.cls),)))
            return self.types.get(node.id, EMPTY)
        if isinstance(node, ast.Attribute):
            base = self.type_of(node.value)
            return _intern(frozenset((("attr", base, node.attr),))) if base else EMPTY
        if isinstance(node, ast.Call):  # a constructor: exactly that class ("new"), not a subclass
            m = self.mod
            spec = R.class_spec(N.dotted(node.func), m.imports, m.modname, m.local_defs)
            return _intern(frozenset((("new", *spec[1:]),))) if spec else EMPTY
        if isinstance(node, ast.Subscript):  # xs[i] with xs: List[Cls]
            return self.type_of(node.value)
        return EMPTY

    def _bind_type(self, target, specs: frozenset, value=None) -> None:
        if not specs and isinstance(value, ast.Constant):  # `self.x = None`: no class, and not open either
            return
        if isinstance(target, ast.Name):
            if specs:
                self.types[target.id] = specs
            else:
                self.types.pop(target.id, None)
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and self.facts is None
        ):
            # A field assigned something of unknown type is "open": its constructed classes are not all known.
            specs = specs or R.OPEN
            self.field_types[target.attr] = self.field_types.get(target.attr, EMPTY) | specs

    def stmts(self, body: list) -> None:
        for s in body:
            handler = _STMT.get(type(s))
            if handler is not None:
                handler(self, s)
            elif not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for child in ast.iter_child_nodes(s):
                    if isinstance(child, ast.expr):
                        self.expr(child)

    def _push(self, frame: Frame) -> frozenset:
        frame.taint = _control(frame.taint)
        self.stack.append(frame)
        saved = self.ctl
        if frame.taint:
            self.ctl = self.ctl | _implicit(frame.taint)
        return saved

    def _pop(self, saved: frozenset) -> None:
        self.stack.pop()
        self.ctl = saved

    def _exit(self, kind: str, line: int) -> None:
        if not self.quiet and self.facts is not None:
            self.pos += 1
            self.exits.append(Exit(self.pos, kind, line, tuple(self.stack)))

    def s_assign(self, s) -> None:
        value = s.value
        if isinstance(value, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in value.elts):
            pairs = [t for t in s.targets if isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(value.elts)]
            if len(pairs) == len(s.targets):  # a, b = x, y: element-wise, not all-to-all
                parts = [self.expr(e) | self.ctl for e in value.elts]
                for target in pairs:
                    for elt, t, v in zip(target.elts, parts, value.elts):
                        self.bind(elt, t)
                        self._bind_type(elt, self.type_of(v), v)
                return
        t = self.expr(value) | self.ctl
        specs = self.type_of(value)
        parts = self.device_parts.get(id(value)) if self.device_parts else None
        none = isinstance(value, ast.Constant) and value.value is None
        for target in s.targets:
            self._note_assign(target, none, s.lineno)
            self.bind(target, t, parts)
            self._assign_key = None
            self._bind_type(target, specs, value)

    def id_tests(self, line: int) -> frozenset | None:
        """The rank-id comparisons that hold at LINE: the `and`-joined comparisons of each enclosing `if` on a
        rank id whose body holds LINE; None when no rank-id test encloses it. A rank-id test whose branch
        says nothing this way (an `else`, a loop, an `or`) still makes it gated, with nothing known."""
        gated, out = False, set()
        for f in self.stack:
            if not _has_ids(f.taint):
                continue
            gated = True
            n = f.node
            if isinstance(n, ast.If) and n.body and n.body[0].lineno <= line <= (n.body[-1].end_lineno or line):
                test = n.test
                for conj in test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]:
                    if isinstance(conj, ast.Compare) and id(conj) in self.id_cmps:
                        out.add(ast.unparse(conj))
        return frozenset(out) if gated else None

    def _note_assign(self, target, none: bool, line: int) -> None:
        """Where a group may be made only on some ranks: `self.F = ...` (pass 1, per field) and `name = ...`
        (pass 2, per local), with the rank-id tests they run under (held_by, project.held_group)."""
        if isinstance(target, ast.Name) and self.facts is not None:
            self._assign_key = "none" if none else self.id_tests(line)
        elif (
            self.facts is None
            and not none
            and isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            self.id_writes.append((target.attr, self.id_tests(line)))

    def held_by(self, name: str) -> frozenset | None:
        """The rank-id comparisons true on every rank where local NAME holds a value (other than None):
        each assignment of it runs under rank-id tests; None if one does not, or nothing is known."""
        keys = [k for k in self.name_keys.get(name, ()) if k != "none"]
        if not keys or any(k is None for k in keys):
            return None
        return frozenset.intersection(*keys) or None

    def s_annassign(self, s) -> None:
        self._bind_type(
            s.target, self._annotation(s.annotation) | (self.type_of(s.value) if s.value else EMPTY), s.value
        )
        if s.value is not None:
            self.bind(s.target, self.expr(s.value) | self.ctl)

    def s_augassign(self, s) -> None:
        self.bind(s.target, self.expr(s.value) | self.expr(s.target) | self.ctl)

    def s_expr(self, s) -> None:
        self.expr(s.value)

    def s_return(self, s) -> None:
        t = self.expr(s.value) if s.value is not None else EMPTY
        # Rank ids do not leave a function through its result: helpers such as
        # compute_dp_attention_world_info(tp_rank, tp_size) return sizes and coordinates
        # of other groups along with them. Only the rank calls themselves are rank ids.
        self.ret = self.ret | _implicit(t) | self.ctl
        self._exit("return", s.lineno)

    def s_raise(self, s) -> None:
        # A raise is fatal for the rank (the job dies, it does not hang): not an exit that skips a collective.
        if s.exc is not None:
            self.expr(s.exc)

    def s_assert(self, s) -> None:
        self.condition(s.test)

    def s_break(self, s) -> None:
        self._exit("break", s.lineno)

    def s_continue(self, s) -> None:
        self._exit("continue", s.lineno)

    def _arms(self, frame: Frame, arms: list, test=None) -> None:
        """Walk alternative arms from the same entry state, then merge their states."""
        saved_ctl = self._push(frame)
        entry, envs, seqs = self.env, [], []
        entry_failed = [sw.failed for sw in self.swallow]
        failed_after = list(entry_failed)
        handed = []
        for arm in arms:
            self.env = dict(entry)
            for sw, f in zip(self.swallow, entry_failed):  # a call that failed in one arm did not run in another
                sw.failed = f
            start, given = len(self.collectives), len(self.handed)
            self.stmts(arm)
            envs.append(self.env)
            seqs.append(self.collectives[start:])
            handed.append(frozenset().union(*self.handed[given:]))
            failed_after = [a or sw.failed for a, sw in zip(failed_after, self.swallow)]
        for sw, f in zip(self.swallow, failed_after):  # after the branch: failed if it could in any arm
            sw.failed = f
        self._pop(saved_ctl)
        frame.balanced = (
            all(_same_ops(seq, seqs[0]) for seq in seqs) or _role_branch(frame, seqs) or _handed_over(seqs, handed)
        )
        if test is not None and sum(1 for seq in seqs if seq) == 1 and _size_guard(test):
            # `if tp_size > 1: broadcast(x)`: the arm without the collective runs only when the group
            # has one rank, where every value is trivially uniform; keep the other arm's state.
            envs = [e for e, seq in zip(envs, seqs) if seq]
        merged = envs[0]
        for other in envs[1:]:
            for k, v in other.items():
                old = merged.get(k)
                merged[k] = v if old is None or old is v else old | v
        self.env = merged

    def s_if(self, s) -> None:
        latch = (
            L.unset_field(s.test, self.mod.latch_props.get(self.cls, {})) if self.facts is None and self.cls else None
        )
        if latch is None:
            taint = self.condition(s.test)
            inner = s.orelse[0] if len(s.orelse) == 1 and isinstance(s.orelse[0], ast.If) else None
            if inner is not None and not inner.orelse and _has_ids(taint) and _cover_every_rank(s.test, inner.test):
                self.no_else.add(id(inner))
            orelse = [] if id(s) in self.no_else else [s.orelse]
            self._arms(Frame("if", s.lineno, taint, node=s), [s.body, *orelse], s.test)
            return
        self.latches.append(latch)  # the body runs while self.<latch> is unset (latches.py)
        self._arms(Frame("if", s.lineno, self.condition(s.test)), [s.body, []], s.test)
        self.latches.pop()
        self.stmts(s.orelse)

    def s_match(self, s) -> None:
        arms = [c.body for c in s.cases]
        if not any(isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None for c in s.cases):
            arms.append([])  # no wildcard case: falling through is an arm too
        self._arms(Frame("if", s.lineno, self.expr(s.subject)), arms)

    def _loop(self, s, header: frozenset, target) -> None:
        frame = Frame("loop", s.lineno, header, node=s)
        saved = self._push(frame)
        if target is not None:
            self.bind(target, header | self.ctl)
        before = dict(self.env)
        if not self.quiet and self.facts is not None:
            # A quiet first pass lets values assigned late in the body reach conditions early in it.
            self.quiet = True
            self.stmts(s.body)
            self.quiet = False
            if isinstance(s, ast.While):
                frame.taint = frame.taint | _control(self._while_test(s))
                self.ctl = saved | _implicit(frame.taint)
        self.stmts(s.body)
        self._pop(saved)
        for k, v in before.items():  # zero iterations is possible: keep the entry state too
            cur = self.env.get(k)
            self.env[k] = v if cur is None or cur is v else cur | v
        self.stmts(s.orelse)

    def s_for(self, s) -> None:
        self.items.update(n.id for n in ast.walk(s.target) if isinstance(n, ast.Name))
        self._item_of(s.target, s.iter)
        self._bind_type(s.target, self.type_of(s.iter))
        self._loop(s, self.expr(s.iter), s.target)

    def s_while(self, s) -> None:
        self._loop(s, self._while_test(s), None)

    def _while_test(self, s) -> frozenset:
        """The taint of a while loop's test; a loop that drains its queue before it exits is decided by
        the queue alone (shapes._drained_queue): a stop event beside it changes when, not how often."""
        queue = _drained_queue(s.test, s.body)
        if queue is None:
            return self.expr(s.test)
        t = EMPTY
        for v in s.test.values:  # every disjunct is still walked (calls in it are observed)
            part = self.expr(v)
            if _not_empty(v) == queue:
                t = t | part
        return t

    def _item_of(self, target, iterable) -> None:
        """`for t in op.pool_transfers:` binds t to an item of the field `pool_transfers`: another object
        than `op`, so a field written on t is not the same-named field of an `op` read elsewhere."""
        if isinstance(target, ast.Name):
            if isinstance(iterable, ast.Attribute):
                self.item_of[target.id] = iterable.attr
            else:
                self.item_of.pop(target.id, None)

    def _swallowed(self, body: list, mode: str | None, construct: str, line: int) -> None:
        """Walk BODY inside a construct that swallows failures (MODE: sources.swallow_scope): a collective
        after a call that can fail there is skipped by the rank whose call failed, which carries on."""
        if mode is None or self.facts is None:
            self.stmts(body)
            return
        self.swallow.append(Swallow(mode, construct, line))
        try:
            self.stmts(body)
        finally:
            self.swallow.pop()

    def s_try(self, s) -> None:
        # Exceptions are not rank-local sources: `except ImportError` and friends are the same on
        # every rank, and a rank that fails for real dies rather than hanging its peers.
        # The exception is: a handler that swallows the failure of an I/O call (a storage attach that
        # fails on one rank) runs on that rank only, and what it returns or sets differs from its peers;
        # and the collectives of the try body after that call are skipped by that rank alone.
        modes = [
            S.swallow_scope(S.exception_names(h.type) if h.type is not None else ["BaseException"])
            for h in s.handlers
            if S.swallows(h)
        ]
        mode = "any" if modes and all(m == "any" for m in modes) else "io" if any(modes) else None
        first = next((h for h in s.handlers if S.swallows(h)), None)
        self._swallowed(s.body, mode, f"`except` at line {first.lineno}" if first else "", s.lineno)
        io = S.io_call(s.body) if s.handlers else None
        for h in s.handlers:
            if h.type is not None:
                self.expr(h.type)
            if h.name:
                self.env[h.name] = EMPTY
            if io and S.swallows(h):
                src = self._src("io", f"a failure of `{io[0]}()` (I/O that can fail on one rank)", io[1])
                saved = self._push(Frame("if", h.lineno, src))
                self.stmts(h.body)
                self._pop(saved)
            else:
                self.stmts(h.body)
        self.stmts(s.orelse)
        self.stmts(s.finalbody)

    def s_with(self, s) -> None:
        mode = None
        for item in s.items:
            t = self.expr(item.context_expr)
            if item.optional_vars is not None:
                self.bind(item.optional_vars, t | self.ctl)
            types = S.suppress_types(item.context_expr, self.mod.imports)
            if types is not None:  # `with suppress(OSError):` is a try whose handler passes
                mode = S.swallow_scope(types)
                construct = f"`suppress({', '.join(types)})` at line {s.lineno}"
        self._swallowed(s.body, mode, construct if mode else "", s.lineno)

    def bind(self, target, t: frozenset, parts: tuple | None = None) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = t
            if self.facts is not None:  # a loop target, `with ... as`, a tuple element: made on every rank
                self.name_keys.setdefault(target.id, []).append(self._assign_key)
        elif isinstance(target, ast.Attribute):
            d = N.dotted(target)
            if d is not None:
                self.env[d] = t
            t = frozenset(a for a in t if not (isinstance(a, Src) and a.kind == "id-local"))
            on_self = isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")
            if isinstance(target.value, ast.Name) and target.value.id in self.items:
                self._state_write(target)
            if on_self and parts is not None:
                # `self.device = torch.device(kind, index)`: the field holds the type's taint, and the index's
                # apart (`device.index`); the project folds the index's back into the field for every read
                # but `.type` (taint.py, exprs._device_parts).
                local = frozenset(a for a in parts[1] if not (isinstance(a, Src) and a.kind == "id-local"))
                if local:
                    key = target.attr + N.DEVICE_INDEX_PART
                    self.attr_assigns[key] = self.attr_assigns.get(key, EMPTY) | local
                t = frozenset(a for a in parts[0] | self.ctl if not (isinstance(a, Src) and a.kind == "id-local"))
            if t and on_self:
                self.attr_assigns[target.attr] = self.attr_assigns.get(target.attr, EMPTY) | t
            if self.facts is None:
                self._wrote(target.value, target.attr, target.lineno)
                if on_self and target.attr in self.latches:
                    self.latch_assigned.add(target.attr)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.bind(elt.value if isinstance(elt, ast.Starred) else elt, t)
        elif isinstance(target, ast.Subscript):
            self.expr(target.slice)
            d = N.dotted(target.value)
            if d is not None:
                # `d[name] = shard_for(tp_rank)`: what a key holds is per rank, which keys there are is
                # not (a later `name in d` is the same on every rank).
                self.env[d] = self.env.get(d, EMPTY) | _without_ids(t)
            if self.facts is None and isinstance(target.value, ast.Attribute):  # self.status[room] = ...
                self._wrote(target.value.value, target.value.attr, target.lineno)


@dataclass
class Swallow:
    """A try body or `suppress()` block whose failures a rank survives; FAILED: the first call in it
    that can fail (a Src), after which its collectives run only on the ranks where that call worked."""

    mode: str  # "any" call can fail (I/O errors only are swallowed) or only "io"-named calls
    construct: str
    line: int
    failed: Src | None = None
    failed_at: object = None  # the call node that set FAILED


def _own_rank_fields(fn, a) -> frozenset:
    """The parameters named like a rank id (names.RANK_VARIABLES) of a method that also reads the
    field of that name on its own object."""
    params = {arg.arg for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs)} & N.RANK_VARIABLES
    if not params or not a.args or a.args[0].arg != "self":
        return frozenset()
    read, stored = set(), set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Attribute) and n.attr in params and isinstance(n.value, ast.Name) and n.value.id == "self":
            (read if isinstance(n.ctx, ast.Load) else stored).add(n.attr)
    return frozenset(read - stored)  # `self.rank = rank` stores the argument as the object's own rank


def _has_ids(taint: frozenset) -> bool:
    return any(isinstance(a, Src) and a.kind.startswith("id") for a in taint)


def _without_ids(taint: frozenset) -> frozenset:
    return frozenset(a for a in taint if not (isinstance(a, Src) and a.kind.startswith("id")))


_CMP = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}


def _rank_test(test) -> tuple | None:
    """`X <op> k` (or `k <op> X`) with an integer k: (X's text, a predicate of X's value)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _CMP):
        return None
    left, right, op = test.left, test.comparators[0], _CMP[type(test.ops[0])]
    if isinstance(right, ast.Constant) and type(right.value) is int:
        k = right.value
        return ast.unparse(left), k, lambda v: op(v, k)
    if isinstance(left, ast.Constant) and type(left.value) is int:
        k = left.value
        return ast.unparse(right), k, lambda v: op(k, v)
    return None


def _cover_every_rank(first, second) -> bool:
    """`if rank == 0: ... elif rank > 0: ...`: two tests of one rank id that every rank (a number from 0 up)
    passes one of, so no rank falls through the `elif` (NeMo's deploy: rank 0 serves, the others follow).
    Predicates of one variable against integer constants change only at those constants: checking each
    value from 0 to past the largest, and one far beyond, decides it."""
    a, b = _rank_test(first), _rank_test(second)
    if a is None or b is None or a[0] != b[0] or max(abs(a[1]), abs(b[1])) > 4096:
        return False  # a rank beyond any job's size is no split of the ranks (and no loop this long)
    top = max(a[1], b[1], 0) + 2
    return all(a[2](v) or b[2](v) for v in (*range(top), 10**9))


def _handed_over(seqs: list, handed: list) -> bool:
    """Every collective of the branch is a method of an object (`engine.generate_other_ranks()`) that each
    arm not calling it hands to another call (`DeployPyTriton(model=engine)`, then `serve()`): that arm may
    issue the object's collectives from there (a server's request handler, a callback), so the arms are
    not known to differ. NeMo's deploy: rank 0 serves the model, whose
    `generate()` broadcasts each request; the other ranks loop in `generate_other_ranks()`, receiving."""
    if not any(seqs):
        return False
    for i, seq in enumerate(seqs):
        for c in seq:
            receiver = c.name.rsplit(".", 1)[0] if c.chain and "." in c.name else ""
            if not receiver:
                return False
            for j, other in enumerate(seqs):
                if j != i and receiver not in handed[j] and not any(d.name == c.name for d in other):
                    return False
    return True


def _control(taint: frozenset) -> frozenset:
    """What can decide a condition: a clock stamp decides nothing until a deadline compares it, and an
    order by stamps is no condition at all."""
    if taint and any(isinstance(a, Src) and a.kind in S.NOT_CONTROL for a in taint):
        return frozenset(a for a in taint if not (isinstance(a, Src) and a.kind in S.NOT_CONTROL))
    return taint


_STMT = {
    ast.Assign: Walker.s_assign,
    ast.AnnAssign: Walker.s_annassign,
    ast.AugAssign: Walker.s_augassign,
    ast.Expr: Walker.s_expr,
    ast.Return: Walker.s_return,
    ast.Raise: Walker.s_raise,
    ast.Assert: Walker.s_assert,
    ast.Break: Walker.s_break,
    ast.Continue: Walker.s_continue,
    ast.If: Walker.s_if,
    ast.For: Walker.s_for,
    ast.AsyncFor: Walker.s_for,
    ast.While: Walker.s_while,
    ast.Try: Walker.s_try,
    ast.With: Walker.s_with,
    ast.AsyncWith: Walker.s_with,
    ast.Pass: lambda w, s: None,
    ast.Import: lambda w, s: None,
    ast.ImportFrom: lambda w, s: None,
    ast.Global: lambda w, s: None,
    ast.Nonlocal: lambda w, s: None,
}
if hasattr(ast, "TryStar"):
    _STMT[ast.TryStar] = Walker.s_try
if hasattr(ast, "Match"):
    _STMT[ast.Match] = Walker.s_match

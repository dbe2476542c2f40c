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
from hctool.lint.shapes import (  # noqa: F401  (re-exported for project.py, checks.py, analysis.py)
    EMPTY, Src, CallAtom, AttrAtom, ParamAtom, FnAtom, Frame, Collective, Exit, ModuleInfo,
    _matches, _implicit, _truthy_args, _mode_exit, _size_guard, _role_branch, _same_ops,
)


@dataclass
class Walker:
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
    ret: frozenset = EMPTY
    attr_assigns: dict = field(default_factory=dict)
    orderings: list = field(default_factory=list)  # pass 2: (line, col, what, Src) for HC104
    types: dict = field(default_factory=dict)  # local name -> receiver specs (receivers.py)
    field_types: dict = field(default_factory=dict)  # pass 1: self.NAME -> specs assigned to it
    mode_exit: tuple | None = None  # (param, position): see _mode_exit
    key: str = ""  # this function's project key (pass 1: constructor parameters become ParamAtoms)
    qual: str = ""  # its qualified name: sources name the function they sit in
    saw_ordering: bool = False  # pass 1: a sort/heap call that pass 2 must look at
    latches: list = field(default_factory=list)  # pass 1: fields of the `if self.F is None:` arms we are in
    latch_assigned: set = field(default_factory=set)  # pass 1: latch fields this function sets in their arm
    direct_latch: str | None = None
    spawns: list = field(default_factory=list)  # pass 1: refs of functions handed to another thread
    writes: list = field(default_factory=list)  # pass 1: (receiver specs or None, field, line) it assigns
    fn_node: object = None
    items: set = field(default_factory=set)  # names bound by for-loops: items of a collection
    state_writes: list = field(default_factory=list)  # (pos, line, col, text, deadline Src): see _state_write

    # ---- statements -------------------------------------------------------
    def run(self, fn: ast.AST) -> Walker:
        a = fn.args
        self.mode_exit = _mode_exit(fn)
        if self.facts is None and fn.name == "__init__" and self.key:
            # Fields a constructor stores take the taint of what its callers pass (PrefillAdder(budget)).
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs)[1:]:
                self.env[arg.arg] = frozenset((ParamAtom(self.key, arg.arg),))
        for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
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
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                and target.value.id == "self" and self.facts is None:
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
        for target in s.targets:
            self.bind(target, t)
            self._bind_type(target, specs, value)

    def s_annassign(self, s) -> None:
        self._bind_type(s.target, self._annotation(s.annotation) | (self.type_of(s.value) if s.value else EMPTY),
                        s.value)
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
        self.expr(s.test)

    def s_break(self, s) -> None:
        self._exit("break", s.lineno)

    def s_continue(self, s) -> None:
        self._exit("continue", s.lineno)

    def _arms(self, frame: Frame, arms: list, test=None) -> None:
        """Walk alternative arms from the same entry state, then merge their states."""
        saved_ctl = self._push(frame)
        entry, envs, seqs = self.env, [], []
        for arm in arms:
            self.env = dict(entry)
            start = len(self.collectives)
            self.stmts(arm)
            envs.append(self.env)
            seqs.append(self.collectives[start:])
        self._pop(saved_ctl)
        frame.balanced = all(_same_ops(seq, seqs[0]) for seq in seqs) or _role_branch(frame, seqs)
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
        latch = L.unset_field(s.test, self.mod.latch_props.get(self.cls, {})) if self.facts is None and self.cls else None
        if latch is None:
            self._arms(Frame("if", s.lineno, self.expr(s.test)), [s.body, s.orelse], s.test)
            return
        self.latches.append(latch)  # the body runs while self.<latch> is unset (latches.py)
        self._arms(Frame("if", s.lineno, self.expr(s.test)), [s.body, []], s.test)
        self.latches.pop()
        self.stmts(s.orelse)

    def s_match(self, s) -> None:
        arms = [c.body for c in s.cases]
        if not any(isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None for c in s.cases):
            arms.append([])  # no wildcard case: falling through is an arm too
        self._arms(Frame("if", s.lineno, self.expr(s.subject)), arms)

    def _loop(self, s, header: frozenset, target) -> None:
        frame = Frame("loop", s.lineno, header)
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
                frame.taint = frame.taint | _control(self.expr(s.test))
                self.ctl = saved | _implicit(frame.taint)
        self.stmts(s.body)
        self._pop(saved)
        for k, v in before.items():  # zero iterations is possible: keep the entry state too
            cur = self.env.get(k)
            self.env[k] = v if cur is None or cur is v else cur | v
        self.stmts(s.orelse)

    def s_for(self, s) -> None:
        self.items.update(n.id for n in ast.walk(s.target) if isinstance(n, ast.Name))
        self._bind_type(s.target, self.type_of(s.iter))
        self._loop(s, self.expr(s.iter), s.target)

    def s_while(self, s) -> None:
        self._loop(s, self.expr(s.test), None)

    def s_try(self, s) -> None:
        # Exceptions are not rank-local sources: `except ImportError` and friends are the same on
        # every rank, and a rank that fails for real dies rather than hanging its peers.
        # The exception is: a handler that swallows the failure of an I/O call (a storage attach that
        # fails on one rank) runs on that rank only, and what it returns or sets differs from its peers.
        self.stmts(s.body)
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
        for item in s.items:
            t = self.expr(item.context_expr)
            if item.optional_vars is not None:
                self.bind(item.optional_vars, t | self.ctl)
        self.stmts(s.body)

    def bind(self, target, t: frozenset) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = t
        elif isinstance(target, ast.Attribute):
            d = N.dotted(target)
            if d is not None:
                self.env[d] = t
            t = frozenset(a for a in t if not (isinstance(a, Src) and a.kind == "id-local"))
            on_self = isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")
            if isinstance(target.value, ast.Name) and target.value.id in self.items:
                self._state_write(target)
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
                self.env[d] = self.env.get(d, EMPTY) | t
            if self.facts is None and isinstance(target.value, ast.Attribute):  # self.status[room] = ...
                self._wrote(target.value.value, target.value.attr, target.lineno)

    def _state_write(self, target) -> None:
        """`req.to_finish = ...` on an item of a collection, under a per-rank deadline: every rank holds
        that item (a request of the replicated batch), and now they hold it in different states (HC104)."""
        src = next((min(d) for f in reversed(self.stack)
                    if (d := [a for a in f.taint if isinstance(a, Src) and a.kind == "deadline"])), None)
        if src is not None and not self.quiet:
            self.state_writes.append((self.pos, target.lineno, target.col_offset + 1, ast.unparse(target), src))

    def _untyped(self, base) -> bool:
        """An object of unknown type held in a local (not self, not a module)."""
        return isinstance(base, ast.Name) and base.id not in ("self", "cls") and base.id not in self.mod.imports \
            and not self.types.get(base.id)

    def _wrote(self, base, name: str, line: int) -> None:
        """Pass 1: this function assigns field NAME of BASE (threads.py: fields another thread writes)."""
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            self.writes.append((None, name, line))
        elif self._untyped(base):
            self.writes.append(("loose", name, line))
        else:
            specs = self.type_of(base)
            if specs:
                self.writes.append((specs, name, line))

    # ---- expressions ------------------------------------------------------
    def expr(self, node) -> frozenset:
        handler = _EXPR.get(type(node))
        if handler is not None:
            return handler(self, node)
        t = EMPTY
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                c = self.expr(child)
                if c:
                    t = t | c
        return t

    def _src(self, kind: str, what: str, line: int, col: int = 1) -> frozenset:
        premise = S.premise_id(kind, what)
        if premise and premise in self.mod.uniform:  # `uniform = ["kv-free-count"]` accepts the premise away
            return EMPTY
        return frozenset((Src(kind, what, self.mod.path, line, 0, col, self.qual),))

    def e_const(self, node) -> frozenset:
        return EMPTY

    def e_binop(self, node) -> frozenset:
        a, b = self.expr(node.left), self.expr(node.right)
        return a | b if a and b else a or b

    def e_compare(self, node) -> frozenset:
        parts = [self.expr(node.left), *(self.expr(c) for c in node.comparators)]
        t = EMPTY
        for p in parts:
            if p:
                t = t | p
        if not t:
            return t
        if S.is_none_test(node):  # `os.getenv("RANK") is None`: whether the launcher set it, not the rank
            t = frozenset(a for a in t if not (isinstance(a, Src) and a.kind.startswith("id")))
        clocks = [[a for a in p if isinstance(a, Src) and a.kind == "clock"] for p in parts]
        if any(clocks) and S.is_deadline_compare(node, [bool(c) for c in clocks]):
            clock = min(a for c in clocks for a in c)
            what = f"a per-rank deadline `{_short(node)}` (clock {clock.what} at line {clock.line})"
            t = frozenset(a for a in t if not (isinstance(a, Src) and a.kind == "clock"))
            t = t | self._src("deadline", what, node.lineno, node.col_offset + 1)
        return t

    def e_unary(self, node) -> frozenset:
        return self.expr(node.operand)

    def e_unary_value(self, node) -> frozenset:
        return self.expr(node.value)

    def e_elts(self, node) -> frozenset:
        t = EMPTY
        for e in node.elts:
            c = self.expr(e)
            if c:
                t = t | c
        return t

    def e_name(self, node) -> frozenset:
        t = self.env.get(node.id)
        if t is not None:
            return t
        if N.is_group_size(node.id):
            return EMPTY
        if node.id in N.RANK_VARIABLES:
            # A bare `rank` is ambiguous (a LoRA or matrix rank): a rank id here, never stored in a field.
            return self._src("id-local" if node.id == "rank" else "id", f"`{node.id}`", node.lineno)
        if node.id in self.mod.rank_local:
            return self._src("rank", f"`{node.id}`", node.lineno)
        return EMPTY

    def e_attribute(self, node) -> frozenset:
        d = N.dotted(node)
        if d is not None:
            t = self.env.get(d)
            if t is not None:
                return t
            if d.split(".", 1)[0] in self.mod.imports:
                return EMPTY  # a module attribute such as dist.ReduceOp.MAX
        attr = node.attr
        if attr in self.mod.uniform or _matches(self.mod.uniform, attr, d) or N.is_group_size(attr):
            return EMPTY
        base = node.value
        # A field is rank-local because of what its own class stores in it, not because of the
        # object it hangs off; a tainted local object (a per-rank result) taints its fields.
        t = EMPTY if isinstance(base, ast.Name) and base.id in ("self", "cls") else self.expr(base)
        # A field is a rank id when its class stores one in it (`self.tp_rank = tp_rank`), not because
        # of its name (`lora.rank` is a matrix rank); configured rank-local names still count.
        if attr in self.mod.rank_local:
            t = t | self._src("rank", f"`{d or attr}`", node.lineno)
        specs = self.type_of(base)
        if not specs:
            if self.facts is not None and self._untyped(base):  # what a thread left in a field of an untyped object
                return t | self.facts.loose(attr)
            return t
        if self.facts is None:
            return t | frozenset((AttrAtom(specs, attr),))
        a = self.facts.attr(specs, attr)
        return t | a if a else t

    def e_subscript(self, node) -> frozenset:
        if isinstance(node.slice, ast.Constant) and node.slice.value in N.RANK_ENV_VARS \
                and N.qualify(N.dotted(node.value), self.mod.imports) == "os.environ":
            return self._src("id", f"os.environ[{node.slice.value!r}]", node.lineno)
        return self.expr(node.value) | self.expr(node.slice)

    def e_lambda(self, node) -> frozenset:
        return EMPTY  # its body runs later, where it is called

    def e_boolop(self, node) -> frozenset:
        # `a and f()` calls f only where a holds: later operands run under earlier ones.
        t = self.expr(node.values[0])
        for value in node.values[1:]:
            saved = self._push(Frame("short", node.lineno, t))
            t = t | self.expr(value)
            self._pop(saved)
        return t

    def e_ifexp(self, node) -> frozenset:
        test = self.expr(node.test)
        frame = Frame("if", node.lineno, test)
        saved = self._push(frame)
        start = len(self.collectives)
        body = self.expr(node.body)
        mid = len(self.collectives)
        orelse = self.expr(node.orelse)
        self._pop(saved)
        frame.balanced = _same_ops(self.collectives[start:mid], self.collectives[mid:])
        return test | body | orelse

    def e_namedexpr(self, node) -> frozenset:
        t = self.expr(node.value)
        self.bind(node.target, t | self.ctl)
        return t

    def e_comprehension(self, node) -> frozenset:
        header = EMPTY
        frames = []
        for gen in node.generators:
            header = header | self.expr(gen.iter)
            frame = Frame("loop", node.lineno, header)
            frames.append((frame, self._push(frame)))
            self.bind(gen.target, header)
            self._bind_type(gen.target, self.type_of(gen.iter))
            for cond in gen.ifs:
                header = header | self.expr(cond)
        if isinstance(node, ast.DictComp):
            t = self.expr(node.key) | self.expr(node.value)
        else:
            t = self.expr(node.elt)
        for frame, saved in reversed(frames):
            self._pop(saved)
        return t | header

    def e_call(self, node) -> frozenset:
        func = node.func
        if isinstance(func, ast.Attribute):
            last = func.attr
            recv = self.expr(func.value)
        elif isinstance(func, ast.Name):
            last, recv = func.id, EMPTY
        else:
            t = self.expr(func)
            for a in node.args:
                t = t | self.expr(a)
            return t
        arg_taints = [self.expr(a) for a in node.args]
        kw_taints = [self.expr(k.value) for k in node.keywords]
        args = recv
        for a in arg_taints + kw_taints:
            if a:
                args = args | a
        name = N.dotted(func)
        qual = N.qualify(name, self.mod.imports)
        display = name or last
        if last in N.UNIFORM_CALLS or _matches(self.mod.uniform, last, qual):
            return EMPTY
        if self._is_collective(func, last, qual):
            self._collective(node, display, (), args)
            self._agreed(node)
            if self.facts is None and self.direct is None:
                self.direct = (node.lineno, display)
                self.direct_latch = self.latches[-1] if self.latches else None
            return EMPTY
        src = self._source(node, func, last, qual, display)
        if src:
            return src
        if self.facts is None:
            self._thread_facts(node, func, last)
        if last in S.MUTATORS and args and isinstance(func, ast.Attribute):  # `xs.append(v)`: xs now holds v
            d = N.dotted(func.value)
            if d is not None and d.split(".", 1)[0] not in ("self", "cls"):
                self.env[d] = self.env.get(d, EMPTY) | (args - recv if recv else args)
        order = EMPTY
        if last in N.ORDERING_CALLS or last in N.HEAP_PUSH:
            self.saw_ordering = True
            if self.facts is not None:
                order = self._ordering(node, func, last, arg_taints)
        if args and not (isinstance(func, ast.Name) and last in N.VALUE_BUILTINS) and _has_id(args):
            # Objects built from a rank id (a per-rank file, a model shard) are not rank-local
            # state: only plain value conversions carry a rank id on.
            args = frozenset(a for a in args if not (isinstance(a, Src) and a.kind.startswith("id")))
        ref = self._ref(func, last)
        if N.op_family(last) != last.lower():  # `self._all_reduce(t, MIN)`: a wrapper's in-place result
            self._agreed(node)
        if ref is None:
            return args | order
        if self.facts is None:
            per_arg = None
            if any(arg_taints) or any(kw_taints):  # by position and keyword, for constructors' fields
                per_arg = (tuple(arg_taints), tuple((k.arg, t) for k, t in zip(node.keywords, kw_taints) if k.arg))
            self.calls.append((ref, node.lineno, display, _truthy_args(node), node.col_offset + 1, per_arg,
                               self.latches[-1] if self.latches else None))
            return frozenset((CallAtom(ref, args),))
        chain, t = self.facts.call(ref, args, _truthy_args(node))
        if chain:
            self._collective(node, display, chain, args)
            self._agreed(node)
        return t | order

    def _thread_facts(self, node, func, last: str) -> None:
        """Pass 1: functions handed to another thread, and containers changed in place (`q.put(x)`)."""
        target = S.spawn_target(node) if last in S.SPAWN_NAMES else None
        if target is not None:
            ref = self._target_ref(target)
            if ref is not None:
                self.spawns.append((ref, node.lineno))
        if last in S.MUTATORS and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute):
            self._wrote(func.value.value, func.value.attr, node.lineno)

    def _target_ref(self, target) -> tuple | None:
        nested = {n.name for n in N._statements(self.fn_node.body) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if isinstance(target, ast.Name) and target.id in nested:  # a closure defined right here
            return ("key", f"{self.key}.{target.id}")
        if isinstance(target, ast.Name):
            return self._ref(target, target.id)
        return self._ref(target, target.attr)

    def _agreed(self, node) -> None:
        """In-place collective arguments (all_reduce(t)) hold the replicated result afterwards."""
        for a in (*node.args, *(k.value for k in node.keywords)):
            d = N.dotted(a.value if isinstance(a, ast.Starred) else a)
            if d is not None:
                self.env[d] = EMPTY

    def _collective(self, node, display: str, chain: tuple, args: frozenset = EMPTY) -> None:
        if self.quiet:  # pass 1 records direct collectives too: _arms() compares arms with them
            return
        self.pos += 1
        real = chain[-1][2].rsplit("`", 2)[-2].rstrip("()") if chain else display
        group = next((ast.unparse(k.value) for k in node.keywords if k.arg in ("group", "process_group")), "")
        sent = frozenset(a for a in args if isinstance(a, Src) and a.kind in ("order", "deadline")) \
            if args and self.facts is not None else EMPTY
        order = min((a for a in sent if a.kind == "order"), default=None)
        self.collectives.append(Collective(self.pos, node.lineno, getattr(node, "end_lineno", None) or node.lineno,
                                           node.col_offset + 1, display, chain, tuple(self.stack),
                                           N.op_family(real), group, order, None, sent))

    def _is_collective(self, func, last: str, qual: str | None) -> bool:
        if last in N.COLLECTIVE_NAMES or _matches(self.mod.collectives, last, qual):
            return True
        if last in N.AMBIGUOUS_COLLECTIVES:
            if qual is not None and qual.startswith("torch.distributed"):
                return True
            return isinstance(func, ast.Attribute) and N.looks_like_group(N.dotted(func.value))
        return False

    def _source(self, node, func, last: str, qual: str | None, display: str) -> frozenset:
        line, col = node.lineno, node.col_offset + 1
        if qual in N.CLOCK_CALLS:
            return self._src("clock", f"`{display}()`", line, col)
        if last in N.RANK_CALLS:
            return self._src("id", f"`{display}()`", line, col)
        if _matches(self.mod.rank_local, last, qual):
            return self._src("rank", f"`{display}()`", line, col)
        if isinstance(func, ast.Attribute):
            kind = S.method_kind(func, self.mod.imports)
            if kind and func.attr in S.SELF_METHODS_EXCLUDED and \
                    any(sp[0] != "attr" for sp in self.type_of(func.value)):
                kind = None  # `req.done()` with `req: Request`: that class's own method, resolved as a call
            if kind:
                return self._src(kind, f"`{display if N.dotted(func) else _short(func)}()`", line, col)
        if qual in ("os.getenv", "os.environ.get") and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in N.RANK_ENV_VARS:
            return self._src("id", f"`{display}({node.args[0].value!r})`", line, col)
        return EMPTY

    def _ref(self, func, last: str) -> tuple | None:
        mod = self.mod
        if isinstance(func, ast.Name):
            if last in mod.local_defs:
                return _intern(("local", last, mod.modname))
            q = mod.imports.get(last)
            return _intern(("imported", last, q)) if q else None
        value = func.value
        if isinstance(value, ast.Name):
            if value.id in ("self", "cls") and self.cls:
                return _intern(("self", last, mod.modname, self.cls))
            q = mod.imports.get(value.id)
            if q and value.id not in self.env:
                return _intern(("modfunc", last, q))
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super" and self.cls:
            return _intern(("super", last, mod.modname, self.cls))
        if last in N.GENERIC_METHODS or last.startswith("__"):
            return None
        specs = self.type_of(value)  # never by method name alone: only on a receiver of known type
        return _intern(("typed", last, specs)) if specs else None

    def _ordering(self, node, func, last: str, arg_taints: list) -> frozenset:
        """A list ordered by wall-clock stamps (sort/min/max keys, heap items) carries an "order" source:
        no condition, but HC104 where it reaches a collective's arguments (checks.py)."""
        taint = EMPTY
        if last in N.HEAP_PUSH and len(arg_taints) >= 2:
            taint = arg_taints[1]
        for kw in node.keywords:
            if kw.arg == "key":
                taint = taint | self._key_taint(kw.value)
        clock = min((s for s in taint if isinstance(s, Src) and s.kind == "clock"), default=None)
        if clock is None:
            return EMPTY
        order = self._src("order", f"`{last}()` by wall-clock stamps ({clock.what})", node.lineno, node.col_offset + 1)
        # In-place orders (`xs.sort(key=...)`, `heappush(heap, item)`) order the list they change.
        target = func.value if last == "sort" and isinstance(func, ast.Attribute) else \
            node.args[0] if last in N.HEAP_PUSH and node.args else None
        d = N.dotted(target) if target is not None else None
        if d is not None:
            self.env[d] = self.env.get(d, EMPTY) | order
        return order

    def _key_taint(self, key) -> frozenset:
        t = EMPTY
        if isinstance(key, ast.Lambda):
            saved, self.env = self.env, {}
            try:
                t = self.expr(key.body)
            finally:
                self.env = saved
            for n in ast.walk(key.body):
                if isinstance(n, ast.Attribute):
                    t = t | self.facts.clock_field(n.attr)
        if isinstance(key, ast.Call) and N.dotted(key.func) in ("attrgetter", "operator.attrgetter"):
            for a in key.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    t = t | self.facts.clock_field(a.value.rsplit(".", 1)[-1])
        return t


_INTERNED: dict = {}


def _intern(x):
    """One object per distinct receiver type or call target: summaries share them, and pickle each once."""
    return _INTERNED.setdefault(x, x)


def _has_id(taint: frozenset) -> bool:
    for a in taint:
        if type(a) is Src and a.kind.startswith("id"):
            return True
    return False


def _control(taint: frozenset) -> frozenset:
    """What can decide a condition: a clock stamp decides nothing until a deadline compares it, and an
    order by stamps is no condition at all."""
    if taint and any(isinstance(a, Src) and a.kind in S.NOT_CONTROL for a in taint):
        return frozenset(a for a in taint if not (isinstance(a, Src) and a.kind in S.NOT_CONTROL))
    return taint


def _short(node) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


_STMT = {
    ast.Assign: Walker.s_assign, ast.AnnAssign: Walker.s_annassign, ast.AugAssign: Walker.s_augassign,
    ast.Expr: Walker.s_expr, ast.Return: Walker.s_return, ast.Raise: Walker.s_raise,
    ast.Assert: Walker.s_assert, ast.Break: Walker.s_break, ast.Continue: Walker.s_continue,
    ast.If: Walker.s_if, ast.For: Walker.s_for, ast.AsyncFor: Walker.s_for, ast.While: Walker.s_while,
    ast.Try: Walker.s_try, ast.With: Walker.s_with, ast.AsyncWith: Walker.s_with,
    ast.Pass: lambda w, s: None, ast.Import: lambda w, s: None, ast.ImportFrom: lambda w, s: None,
    ast.Global: lambda w, s: None, ast.Nonlocal: lambda w, s: None,
}
if hasattr(ast, "TryStar"):
    _STMT[ast.TryStar] = Walker.s_try
if hasattr(ast, "Match"):
    _STMT[ast.Match] = Walker.s_match

_EXPR = {
    ast.Constant: Walker.e_const, ast.BinOp: Walker.e_binop, ast.Compare: Walker.e_compare,
    ast.UnaryOp: Walker.e_unary, ast.Tuple: Walker.e_elts, ast.List: Walker.e_elts, ast.Set: Walker.e_elts,
    ast.Starred: Walker.e_unary_value, ast.Await: Walker.e_unary_value, ast.Name: Walker.e_name, ast.Attribute: Walker.e_attribute,
    ast.Subscript: Walker.e_subscript, ast.Lambda: Walker.e_lambda, ast.BoolOp: Walker.e_boolop,
    ast.IfExp: Walker.e_ifexp, ast.NamedExpr: Walker.e_namedexpr, ast.Call: Walker.e_call,
    ast.ListComp: Walker.e_comprehension, ast.SetComp: Walker.e_comprehension,
    ast.GeneratorExp: Walker.e_comprehension, ast.DictComp: Walker.e_comprehension,
}

"""The walker's expressions: the taint of each expression, calls resolved against the project (pass 2)
or kept symbolic (pass 1), collectives recorded with the control frames around them. A mixin of
walker.Walker, which holds the state (env, stack, facts) these methods use."""

from __future__ import annotations

import ast

from hctool.lint import names as N
from hctool.lint import sources as S
from hctool.lint.observe import _intern, _short
from hctool.lint.shapes import (
    EMPTY,
    AttrAtom,
    CallAtom,
    Collective,
    Frame,
    Src,
    _argument_names,
    _carried,
    _matches,
    _same_ops,
    _truthy_args,
)


class Expressions:
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

    def e_const(self, node) -> frozenset:
        return EMPTY

    def e_binop(self, node) -> frozenset:
        a, b = self.expr(node.left), self.expr(node.right)
        return a | b if a and b else a or b

    def condition(self, node) -> frozenset:
        """A condition's taint. A rank variable read as a truth value (`if os.environ.get("RANK") and
        os.environ.get("WORLD_SIZE"):`) asks whether the launcher set it, as `is None` does: a rank's
        string, "0" included, is true on every rank (NeMo's SageMaker set-up)."""
        if isinstance(node, ast.BoolOp):
            t = EMPTY
            for v in node.values:
                t = t | self.condition(v)
            return t
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return self.condition(node.operand)
        t = EMPTY if isinstance(node, ast.Call) and self._rank_env_read(node) else self.expr(node)
        if self.facts is not None:
            self.cond_kinds[id(node)] = self.cond_kinds.get(id(node), frozenset()) | {
                a.kind for a in t if isinstance(a, Src)
            }
        return t

    def _rank_env_read(self, node: ast.Call) -> bool:
        qual = N.qualify(N.dotted(node.func), self.mod.imports)
        return (
            qual in ("os.getenv", "os.environ.get")
            and bool(node.args)
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in N.RANK_ENV_VARS
        )

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
        elif S.is_membership(node) and _has_id(parts[0]):
            # `get_rank() in get_process_group_ranks(g)`: whether this rank is a member of a group, and
            # every member answers the same; a rank outside it takes no part in that group's collectives.
            t = frozenset(a for a in parts[0] if not (isinstance(a, Src) and a.kind.startswith("id")))
            for p in parts[1:]:
                t = t | p
        if _has_id(t):
            self.id_cmps[id(node)] = t
        clocks = [[a for a in p if isinstance(a, Src) and a.kind == "clock"] for p in parts]
        if any(clocks) and S.is_deadline_compare(node, [bool(c) for c in clocks]):
            if not any((a.path, a.fn) == (self.mod.path, self.qual) for c in clocks for a in c):
                # Every clock reading came back from another function (ParlAI's `_get_time()`, which gathers
                # rank 0's timers whenever a limit is set): a decision on it is taken where it was measured or
                # not at all (checks._DECIDED_WHERE_MEASURED).
                return frozenset(a for a in t if not (isinstance(a, Src) and a.kind == "clock"))
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
            return self._src(
                "id-local" if node.id == "rank" else "id",
                f"`{node.id}`",
                node.lineno,
                node.col_offset + 1,
                N.dims(node.id),
            )
        if node.id in self.mod.rank_local:
            return self._src("rank", f"`{node.id}`", node.lineno, node.col_offset + 1)
        return EMPTY

    def e_attribute(self, node, part: str = "") -> frozenset:
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
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            t = EMPTY
        elif attr == "type" and isinstance(base, ast.Attribute):
            # `state.device.type`: the field's value without the index of the `torch.device(type, index)`
            # stored in it (walker.bind records that index apart, project.attr_keys reads `F.type`).
            t = self.e_attribute(base, N.DEVICE_TYPE_PART)
        else:
            t = self.expr(base)
        # A field is a rank id when its class stores one in it (`self.tp_rank = tp_rank`), not because
        # of its name (`lora.rank` is a matrix rank); configured rank-local names still count.
        if attr in self.mod.rank_local:
            t = t | self._src("rank", f"`{d or attr}`", node.lineno)
        specs = self.type_of(base)
        if not specs:
            if self.facts is not None and self._untyped(base):  # what a thread left in a field of an untyped object
                return t | self.facts.loose(self._loose_key(base, attr))
            return t
        if self.facts is None:
            return t | frozenset((AttrAtom(specs, attr + part),))
        a = self.facts.attr(specs, attr + part)
        return t | a if a else t

    def e_subscript(self, node) -> frozenset:
        if (
            isinstance(node.slice, ast.Constant)
            and node.slice.value in N.RANK_ENV_VARS
            and N.qualify(N.dotted(node.value), self.mod.imports) == "os.environ"
        ):
            return self._src("id", f"os.environ[{node.slice.value!r}]", node.lineno)
        return self.expr(node.value) | self.expr(node.slice)

    def e_lambda(self, node) -> frozenset:
        return EMPTY  # its body runs later, where it is called

    def e_boolop(self, node) -> frozenset:
        # `a and f()` calls f only where a holds: later operands run under earlier ones.
        parts = [self.expr(node.values[0])]
        t = parts[0]
        for value in node.values[1:]:
            saved = self._push(Frame("short", node.lineno, t))
            parts.append(self.expr(value))
            t = t | parts[-1]
            self._pop(saved)
        members = [v for v in node.values if _member_test(v)] if isinstance(node.op, ast.And) and t else []
        if members:
            # `master_rank in [src, dest] and local_rank == 0` around a collective on new_group([src, dest]):
            # the condition selects the members of a group by its rank list, and a test of another rank id
            # beside it picks the process of each listed rank (its local rank 0), not some members of the
            # group against others. A test of the same rank (`rank in ranks and rank == ranks[0]`) does.
            tested = {_tested(m.left) for m in members} - {None}
            t = EMPTY
            for value, part in zip(node.values, parts):
                same = any(N.dotted(n) in tested for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute)))
                t = t | (part if same and not _member_test(value) else _without_ids(part))
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
        if _progress_of(node.body, node.orelse) or _progress_of(node.orelse, node.body):
            return body | orelse  # `tqdm(xs) if rank == 0 else xs`: the same items, with a bar on one rank
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
            self._item_of(gen.target, gen.iter)
            for cond in gen.ifs:
                header = header | self.expr(cond)
        if isinstance(node, ast.DictComp):
            t = self.expr(node.key) | self.expr(node.value)
        else:
            t = self.expr(node.elt)
        for _frame, saved in reversed(frames):
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
        if "recv" in last or "send" in last:  # what names.MESSAGE_RECV and MESSAGE_SEND need at least
            self._message(node, last, qual)
        if qual == "torch.device":
            self._device_parts(node, arg_taints, kw_taints)
        if last in N.UNIFORM_CALLS or _matches(self.mod.uniform, last, qual):
            return EMPTY
        if (
            last in N.AGREED_METHODS
            and isinstance(func, ast.Attribute)
            and not (qual or "").startswith(N.NUMERIC_MODULES)
            and not self._is_collective(func, last, qual)
        ):
            return EMPTY
        if self._is_collective(func, last, qual):
            self._collective(node, display, (), args)
            self._agreed(node)
            if self.facts is None and self.direct is None:
                self.direct = (node.lineno, display)
                self.direct_latch = self.latches[-1] if self.latches else None
            if self.facts is None:
                self.direct_dims = self.direct_dims | self._call_dims(node)
            return EMPTY
        src = self._source(node, func, last, qual, display)
        if src:
            return src
        if self.facts is None:
            if last in S.SPAWN_NAMES or last in S.MUTATORS:  # _thread_facts notes nothing else
                self._thread_facts(node, func, last)
            if S.is_pool_change(last) and isinstance(func, ast.Attribute):
                pool = S.pool_field(N.dotted(func.value))
                if pool:
                    self.frees.append((pool, self._per_rank_control(), node.lineno))
        if last in S.MUTATORS and args and isinstance(func, ast.Attribute):  # `xs.append(v)`: xs now holds v
            d = N.dotted(func.value)
            if self.facts is None and isinstance(func.value, ast.Name) and self._per_rank_control():
                self.lag_lists.add(func.value.id)
            if d is not None and d.split(".", 1)[0] not in ("self", "cls"):
                # A rank's own shard stored in a list is a per-rank value, not a per-rank shape of the list.
                held = _without_ids(args - recv if recv else args)
                if held:
                    self.env[d] = self.env.get(d, EMPTY) | held
        order = EMPTY
        if (last in N.ORDERING_CALLS or last in N.HEAP_PUSH) and self.facts is not None:
            order = self._ordering(node, func, last, arg_taints)
        if args and not (isinstance(func, ast.Name) and last in N.VALUE_BUILTINS) and _has_built(args):
            # Objects built from a rank id (a per-rank file, a model shard) are not rank-local
            # state: only plain value conversions carry a rank id on. Nor is what a call makes of a
            # swallowed failure's fallback value (a path joined from an empty name, a store at a fallback
            # address): the failure decides where its handler's path goes; a value it falls back to is
            # data (held-out: GLIP's checkpoint path, xinference's config, vllm-ascend's address; 0 of 3
            # judged real, while every real failure finding was a skipped collective or a verdict).
            args = frozenset(a for a in args if not _built_from(a))
        ref = self._ref(func, last)
        if N.op_family(last) != last.lower():  # `self._all_reduce(t, MIN)`: a wrapper's in-place result
            self._agreed(node)
        if self.facts is not None and self.stack:
            given = {N.dotted(a) for a in (*node.args, *(k.value for k in node.keywords))}
            given.discard(None)
            if given:
                self.handed.append(frozenset(given))
        if ref is None:
            if self.swallow:
                self._may_fail(node, last, qual, display)
            return args | order
        if self.facts is None:
            per_arg = None
            if any(arg_taints) or any(kw_taints):  # by position and keyword, for constructors' fields
                per_arg = (tuple(arg_taints), tuple((k.arg, t) for k, t in zip(node.keywords, kw_taints) if k.arg))
            cause = self._per_rank_cause()
            if cause is not False:
                self.gated_refs.append((ref, node.lineno, cause))
            tests = self.id_tests(node.lineno) if self.stack else None
            if tests is not None:
                self.id_calls.append((ref, node.lineno, tests))
            self.calls.append(
                (
                    ref,
                    node.lineno,
                    display,
                    _truthy_args(node),
                    node.col_offset + 1,
                    per_arg,
                    self.latches[-1] if self.latches else None,
                )
            )
            return frozenset((CallAtom(ref, args),))
        chain, t = self.facts.call(ref, args, _truthy_args(node))
        if chain:
            followed = _argument_names(node) if self.facts.follows(ref) else EMPTY
            self._collective(node, display, chain, args, followed)
            self._agreed(node)
        elif self.swallow:
            self._may_fail(node, last, qual, display)
        return t | order

    def _device_parts(self, node, arg_taints: list, kw_taints: list) -> None:
        """`torch.device(type, index)`: the taint of its type argument apart from its index's, for a field
        it is stored in (walker.bind). A rank-local index (`local_rank % device_count()`) makes the device
        rank-local, and its `.index`, but not its `.type`: that is the type argument, whatever the index
        (accelerate's `PartialState().device.type == "neuron"`, with the index from LOCAL_RANK). Only the
        two-argument form splits; `torch.device("cuda:1")` is one string, its type and index together."""
        kws = {k.arg: t for k, t in zip(node.keywords, kw_taints)}
        if len(node.args) >= 2:
            kind, index = arg_taints[0], arg_taints[1]
        elif "index" in kws and len(node.args) + ("type" in kws) == 1:
            kind, index = (arg_taints[0] if node.args else kws["type"]), kws["index"]
        else:
            return
        if _has_id(kind | index):  # as for any object built from a rank id (e_call): no rank id on
            kind, index = _without_ids(kind), _without_ids(index)
        self.device_parts[id(node)] = (kind, index)

    def _per_rank_control(self) -> bool:
        """Pass 1: whether this point runs under a condition or loop decided by an event poll, a per-rank
        deadline, a swallowed failure or a configured rank-local name (what makes a pool's frees lag)."""
        return self._per_rank_cause() is not False

    def _per_rank_cause(self):
        """The source of that control, (path, line), where one condition shows it; None where only a loop
        over a list filled under such a condition does; False where there is none."""
        for f in self.stack:
            src = next((a for a in f.taint if isinstance(a, Src) and a.kind in S.LAGGING_KINDS), None)
            if src is not None:
                return (src.path, src.line)
            # `for req in expired:` over a list filled under such a condition (`expired.append(req)`)
            loop = f.node if f.kind == "loop" else None
            if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Name) and loop.iter.id in self.lag_lists:
                return None
        return False

    def _may_fail(self, node, last: str, qual: str | None, display: str) -> None:
        """A call inside a construct that swallows its failure: from here on, that scope's collectives run
        only where it worked. Tensor arithmetic and logging are not what fails on one rank."""
        if (
            self.quiet
            or (qual or "").startswith(("torch.", "math.", "logging."))
            or last in N.VALUE_BUILTINS
            or (isinstance(node.func, ast.Name) and last in N.PURE_BUILTINS)
            or (N.dotted(node.func) or "").split(".", 1)[0] in ("logger", "log", "logging")
        ):
            return
        for scope in self.swallow:
            # The outermost call of an expression is the one to name (`SharedMemory(name=make_name())`):
            # its arguments were walked, and marked, first.
            inner = scope.failed is not None and scope.failed_at is not None and _inside(scope.failed_at, node)
            if (scope.failed is None or inner) and (scope.mode == "any" or S.IO_CALL.search(last)):
                scope.failed_at = node
                scope.failed = next(
                    iter(
                        self._src(
                            "io",
                            f"a failure of `{display}()` that the {scope.construct} swallows",
                            node.lineno,
                            node.col_offset + 1,
                        )
                    ),
                    None,
                )

    def _message(self, node, last: str, qual: str | None) -> None:
        """Messages to and from other processes: a function that receives them runs on command (pass 1);
        a message sent before a collective may be the command that makes the followers enter it (pass 2)."""
        if self.facts is None:
            if N.is_message(N.MESSAGE_RECV, last, qual):
                self.receives = True
        elif not self.quiet and N.is_message(N.MESSAGE_SEND, last, qual):
            self.pos += 1
            carried = EMPTY
            for a in (*node.args, *(k.value for k in node.keywords)):
                carried = carried | _carried(a)
            self.sends.append((self.pos, tuple(self.stack), carried))

    def _agreed(self, node) -> None:
        """In-place collective arguments (all_reduce(t)) hold the replicated result afterwards."""
        for a in (*node.args, *(k.value for k in node.keywords)):
            d = N.dotted(a.value if isinstance(a, ast.Starred) else a)
            if d is not None:
                self.env[d] = EMPTY

    def _collective(
        self, node, display: str, chain: tuple, args: frozenset = EMPTY, followed: frozenset = EMPTY
    ) -> None:
        if self.quiet:  # pass 1 records direct collectives too: _arms() compares arms with them
            return
        self.pos += 1
        real = chain[-1][2].rsplit("`", 2)[-2].rstrip("()") if chain else display
        group = next((ast.unparse(k.value) for k in node.keywords if k.arg in ("group", "process_group")), "")
        # The parallel dimensions of the group it runs on (checks._other_dimension): a real collective's own
        # (_call_dims); for a call into helpers, the group it hands them, else the union of its callees'
        # collectives' groups (project.group_dims).
        group_arg = _group_names(node) if chain else ""
        if group_arg:
            dims = N.dims(group_arg) or N.group_token(group_arg)
        else:
            dims = EMPTY if chain else self._call_dims(node)
        if not dims and chain and self.facts is not None:
            dims = self.facts.group_dims(self._ref(node.func, _last(node.func)), _truthy_args(node))
        sent = (
            frozenset(a for a in args if isinstance(a, Src) and a.kind in ("order", "deadline"))
            if args and self.facts is not None
            else EMPTY
        )
        order = min((a for a in sent if a.kind == "order"), default=None)
        members = self._group_members(node) if self.facts is not None and self.id_cmps else None
        stack = tuple(self.stack)
        failed = [Frame("swallow", s.failed.line, frozenset((s.failed,))) for s in self.swallow if s.failed]
        if failed:  # skipped where an earlier call of its try/suppress block failed (walker._swallowed)
            stack = (*failed, *stack)
        self.collectives.append(
            Collective(
                self.pos,
                node.lineno,
                getattr(node, "end_lineno", None) or node.lineno,
                node.col_offset + 1,
                display,
                chain,
                stack,
                N.op_family(real),
                group,
                order,
                None,
                sent,
                dims,
                followed,
                members,
            )
        )

    def _call_dims(self, node) -> frozenset:
        """The parallel dimensions of the group a real collective runs on: those its group argument names;
        those of the object it is called on (`get_tp_group().all_reduce(x)`); those of its own name
        (`tensor_model_parallel_all_reduce(x)`); else, a function called with no group, the world
        (names.WORLD): every rank, whatever its coordinates. A group that names no dimension
        (`group=self.group`, a group it was handed, `self.comm.all_reduce(x)`) is its own text
        (names.group_token): only a rank asked about that group sets its members apart."""
        func = node.func
        last = _last(func)
        named = _group_names(node)
        given = next((k.value for k in node.keywords if k.arg in ("group", "process_group", "pg")), None)
        if isinstance(given, ast.Constant) and given.value is None:
            return frozenset((N.WORLD,))
        if given is not None and not named:  # `group=self.weight_update_groups[0]`: a group all the same
            named = _arg_name(given) or ast.unparse(given)
        position = N.GROUP_POSITION.get(last)
        if not named and position is not None and len(node.args) > position:
            named = _arg_name(node.args[position]) or "?"
        if named:
            replaced = self._replaced(named)
            if replaced is not None:  # `if group is None: group = self.parallel_context.dp_pg`
                return replaced
            if self._defaults_to_none(named):
                return frozenset((N.WORLD,))  # a wrapper's `group=None`: the world unless handed one
            return N.dims(named) or N.group_token(named)
        own = N.dims(last)
        if own:
            return own
        if isinstance(func, ast.Attribute):
            receiver = N.dotted(func.value)
            head = receiver.split(".", 1)[0] if receiver else ""
            if not (head in self.mod.imports or head in ("torch", "dist")) or head in self.env:
                receiver_text = _arg_name(func.value) or ast.unparse(func.value)
                return N.dims(receiver_text) or N.group_token(receiver_text)  # a communicator or group object
        return frozenset((N.WORLD,))

    def _replaced(self, name: str) -> frozenset | None:
        """The dimensions of what this function assigns to the parameter NAME (a wrapper that fills its own
        default: `if process_group is None: process_group = self.parallel_context.dp_pg`, lighteval's
        nanotron model), when every such value names one; None where NAME is not a parameter it assigns."""
        fn = self.fn_node
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        a = fn.args
        if name not in {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}:
            return None
        values = [
            n.value
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
        ]
        named = [N.dims(_arg_name(v) or ast.unparse(v)) for v in values]
        if not named or not all(named):
            return None
        return frozenset().union(*named)

    def _defaults_to_none(self, name: str) -> bool:
        """Whether NAME is a parameter of this function whose default is None (`def barrier(group=None)`)."""
        fn = self.fn_node
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        a = fn.args
        pairs = list(zip(reversed(a.args), reversed(a.defaults))) + [
            (p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None
        ]
        return any(p.arg == name and isinstance(d, ast.Constant) and d.value is None for p, d in pairs)

    def _group_members(self, node) -> tuple | None:
        """Pass 2: the rank-id tests that hold on every rank holding the group a collective runs on (its
        receiver, `self._model_update_group.broadcast(...)`, or an argument that names a group), when that
        group is a field or a local made only under rank-id tests (issue 34: OpenRLHF's weight-sync group of
        DeepSpeed rank 0 and the vLLM ranks, made only where `get_rank() == 0`); None for any other group."""
        func = node.func
        exprs = [func.value] if isinstance(func, ast.Attribute) else []
        exprs += [a for a in (*node.args, *(k.value for k in node.keywords)) if _names_group(_arg_name(a))]
        for e in exprs:
            key = None
            if isinstance(e, ast.Name):
                key = self.held_by(e.id)
            elif isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self" and self.cls:
                key = self.facts.held_group(self.type_of(e.value), e.attr)
            if key:
                return (key, self.id_cmps)
        return None

    def _is_collective(self, func, last: str, qual: str | None) -> bool:
        if last in N.COLLECTIVE_NAMES or _matches(self.mod.collectives, last, qual):
            return True
        if last in N.AMBIGUOUS_COLLECTIVES:
            if qual is not None and qual.startswith("torch.distributed"):
                return True
            return isinstance(func, ast.Attribute) and N.looks_like_group(N.dotted(func.value))
        return False

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


def _arg_name(arg) -> str:
    """The dotted name an argument is, or calls (`mpu.get_data_parallel_group()`), with the names that
    call is given (`gpc.get_group(ParallelMode.PARALLEL_2D_ROW)`: the mode names the dimension); else
    nothing."""
    if isinstance(arg, ast.Call):
        inner = [N.dotted(a) for a in (*arg.args, *(k.value for k in arg.keywords))]
        return " ".join(filter(None, [N.dotted(arg.func), *inner]))
    return N.dotted(arg) or ""


def _group_names(node: ast.Call) -> str:
    """The names of a call's arguments that name a process group (or a parallel mode)."""
    return " ".join(filter(_names_group, map(_arg_name, (*node.args, *(k.value for k in node.keywords)))))


def _last(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _names_group(text: str) -> bool:
    low = text.lower()
    return "group" in low or "parallel_mode" in low or "parallelmode" in low or low.endswith("pg") or "mesh" in low


def _inside(inner, outer) -> bool:
    return (outer.lineno, outer.col_offset) <= (inner.lineno, inner.col_offset) and (
        inner.end_lineno,
        inner.end_col_offset,
    ) <= (outer.end_lineno, outer.end_col_offset)


def _tested(node) -> str | None:
    """The rank a membership test tests: `master_rank`, `self.rank`, or the call `dist.get_rank`."""
    return N.dotted(node.func if isinstance(node, ast.Call) else node)


def _member_test(node) -> bool:
    """`x_rank in [a, b]` / `rank in ranks`: a rank tested for membership of a list of ranks."""
    if not (isinstance(node, ast.Compare) and S.is_membership(node) and len(node.ops) == 1):
        return False
    left = _tested(node.left) or ""
    right = node.comparators[0]
    listed = isinstance(right, (ast.List, ast.Tuple, ast.Set)) or "rank" in (N.dotted(right) or "").lower()
    return "rank" in left.rsplit(".", 1)[-1].lower() and listed


def _without_ids(taint: frozenset) -> frozenset:
    return frozenset(a for a in taint if not (type(a) is Src and a.kind.startswith("id"))) if _has_id(taint) else taint


def _progress_of(wrapped, plain) -> bool:
    """WRAPPED is a progress bar over PLAIN (`tqdm(pbar)`, `track(xs, ...)`): it yields PLAIN's items."""
    return (
        isinstance(wrapped, ast.Call)
        and _last(wrapped.func) in N.PROGRESS_WRAPPERS
        and bool(wrapped.args)
        and ast.dump(wrapped.args[0]) == ast.dump(plain)
    )


def _built_from(a) -> bool:
    return type(a) is Src and (a.kind.startswith("id") or a.kind == "io")


def _has_built(taint: frozenset) -> bool:
    return any(_built_from(a) for a in taint)


def _has_id(taint: frozenset) -> bool:
    for a in taint:
        if type(a) is Src and a.kind.startswith("id"):
            return True
    return False


_EXPR = {
    ast.Constant: Expressions.e_const,
    ast.BinOp: Expressions.e_binop,
    ast.Compare: Expressions.e_compare,
    ast.UnaryOp: Expressions.e_unary,
    ast.Tuple: Expressions.e_elts,
    ast.List: Expressions.e_elts,
    ast.Set: Expressions.e_elts,
    ast.Starred: Expressions.e_unary_value,
    ast.Await: Expressions.e_unary_value,
    ast.Name: Expressions.e_name,
    ast.Attribute: Expressions.e_attribute,
    ast.Subscript: Expressions.e_subscript,
    ast.Lambda: Expressions.e_lambda,
    ast.BoolOp: Expressions.e_boolop,
    ast.IfExp: Expressions.e_ifexp,
    ast.NamedExpr: Expressions.e_namedexpr,
    ast.Call: Expressions.e_call,
    ast.ListComp: Expressions.e_comprehension,
    ast.SetComp: Expressions.e_comprehension,
    ast.GeneratorExp: Expressions.e_comprehension,
    ast.DictComp: Expressions.e_comprehension,
}

"""What the walker observes besides taint: rank-local sources at calls, fields a function writes and
functions it hands to threads (threads.py), state set under a per-rank deadline and lists ordered by
wall-clock stamps (HC104). A mixin of walker.Walker, which holds the state these methods use."""

from __future__ import annotations

import ast

from hctool.lint import names as N
from hctool.lint import sources as S
from hctool.lint.shapes import EMPTY, Src, _matches

_INTERNED: dict = {}


def _intern(x):
    """One object per distinct receiver type or call target: summaries share them, and pickle each once."""
    return _INTERNED.setdefault(x, x)


def _short(node) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


class Observations:
    def _state_write(self, target) -> None:
        """`req.to_finish = ...` on an item of a collection, under a per-rank deadline: every rank holds
        that item (a request of the replicated batch), and now they hold it in different states (HC104)."""
        src = next(
            (
                min(d)
                for f in reversed(self.stack)
                if (d := [a for a in f.taint if isinstance(a, Src) and a.kind == "deadline"])
            ),
            None,
        )
        if src is not None and not self.quiet:
            self.state_writes.append((self.pos, target.lineno, target.col_offset + 1, ast.unparse(target), src))

    def _untyped(self, base) -> bool:
        """An object of unknown type held in a local (not self, not a module)."""
        return (
            isinstance(base, ast.Name)
            and base.id not in ("self", "cls")
            and base.id not in self.mod.imports
            and not self.types.get(base.id)
        )

    def _loose_key(self, base, name: str) -> str:
        """How a field of an untyped object is matched between a thread's write and a read: by its name,
        and by the field whose items the object was taken from (`transfer` in `op.pool_transfers`), so
        `transfer.host_indices` is not `operation.host_indices` (issue 34: two classes, one field name)."""
        of = self.item_of.get(base.id) if isinstance(base, ast.Name) else None
        return f"{name}@{of}" if of else name

    def _wrote(self, base, name: str, line: int) -> None:
        """Pass 1: this function assigns field NAME of BASE (threads.py: fields another thread writes)."""
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            self.writes.append((None, name, line))
            if self.cls and self._per_rank_control():  # the object changes at a time of this rank's own
                self.frees.append((S.SELF_LAGS, True, line))
        elif self._untyped(base):
            self.writes.append(("loose", self._loose_key(base, name), line))
        else:
            specs = self.type_of(base)
            if specs and isinstance(base, ast.Name) and all(sp[0] == "new" for sp in specs):
                # `batch = DataProto(); batch.meta_info = ...`: an object this function built itself; what it
                # writes there happens before anyone else can hold it (ROLL's driver threads, issue 34)
                return
            if specs:
                self.writes.append((specs, name, line))

    # ---- expressions ------------------------------------------------------

    def _src(self, kind: str, what: str, line: int, col: int = 1, dims: frozenset = EMPTY) -> frozenset:
        premise = S.premise_id(kind, what)
        if premise and premise in self.mod.uniform:  # `uniform = ["kv-free-count"]` accepts the premise away
            return EMPTY
        return frozenset((Src(kind, what, self.mod.path, line, 0, col, self.qual, dims),))

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
        nested = {
            n.name for n in N._statements(self.fn_node.body) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        if isinstance(target, ast.Name) and target.id in nested:  # a closure defined right here
            return ("key", f"{self.key}.{target.id}")
        if isinstance(target, ast.Name):
            return self._ref(target, target.id)
        return self._ref(target, target.attr)

    def _source(self, node, func, last: str, qual: str | None, display: str) -> frozenset:
        line, col = node.lineno, node.col_offset + 1
        if qual in N.CLOCK_CALLS:
            return self._src("clock", f"`{display}()`", line, col)
        if last in N.RANK_CALLS:  # its parallel dimension: the function's name, or the group it is asked about
            asked = [ast.unparse(a) for a in (*node.args, *(k.value for k in node.keywords))]
            named = frozenset().union(*(N.dims(t) for t in (last, *asked)))
            if not named and asked:  # the rank within a group that names no dimension (exprs._call_dims)
                named = N.group_token(asked[0])
            return self._src("id", f"`{display}()`", line, col, named)
        if _matches(self.mod.rank_local, last, qual):
            return self._src("rank", f"`{display}()`", line, col)
        if isinstance(func, ast.Attribute):
            kind = S.method_kind(func, self.mod.imports, node)
            if (
                kind
                and func.attr in S.SELF_METHODS_EXCLUDED
                and any(sp[0] != "attr" for sp in self.type_of(func.value))
            ):
                kind = None  # `req.done()` with `req: Request`: that class's own method, resolved as a call
            if kind:
                return self._src(kind, f"`{display if N.dotted(func) else _short(func)}()`", line, col)
        if (
            qual in ("os.getenv", "os.environ.get")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in N.RANK_ENV_VARS
        ):
            return self._src("id", f"`{display}({node.args[0].value!r})`", line, col)
        return EMPTY

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
        target = (
            func.value
            if last == "sort" and isinstance(func, ast.Attribute)
            else node.args[0]
            if last in N.HEAP_PUSH and node.args
            else None
        )
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

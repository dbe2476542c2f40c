"""Whether a rank-local branch really makes ranks diverge: the collective sequences of every path
from the branch to the function's exit.

A branch on a rank id that issues a barrier before a `yield` on one side and after it on the other,
or `if rank != 0: barrier(); return` ahead of one barrier that every other path reaches, gates
collectives and yet every rank issues the same sequence: what the arms issue differs, where they
issue it does not matter. The walker's per-branch comparison (shapes._same_ops) cannot see that;
this module enumerates the paths from the branch to the function's exit and compares their
sequences of collectives, each named by (op, group expression).

It answers "converges" only when it can follow every path: anything it cannot (a loop or a `try`
around the branch, a loop or `try` after it that holds a collective or a `return`, a collective
under a short-circuit or in a comprehension, more paths than MAX_PATHS) answers "no", and the
finding stays. Conditions on local names are correlated along a path (`if should_block:` ...
`if not should_block:` take opposite arms) while nothing assigns those names in between; any other
condition may go either way.
"""

from __future__ import annotations

import ast

MAX_PATHS = 256


class _GiveUp(Exception):
    pass


# A comparison and its negation, keyed by the first (paths correlate `x != y` with `x == y`).
_NEGATED = {ast.NotEq: ast.Eq, ast.IsNot: ast.Is, ast.NotIn: ast.In, ast.GtE: ast.Lt, ast.LtE: ast.Gt}


def _cond_key(test) -> tuple | None:
    """(key, names, value) for a condition on local names only: `x`, `not x`, `rank != src`. A call
    or a field can change between two tests of it; a local changes only where it is assigned."""
    value = True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, value = test.operand, not value
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _NEGATED:
        # `rank != src` is `not (rank == src)`: the two tests of ignite's one_rank_first are one condition
        test = ast.Compare(test.left, [_NEGATED[type(test.ops[0])]()], test.comparators)
        value = not value
    names = set()
    for n in ast.walk(test):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif not isinstance(
            n,
            (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Constant, ast.expr_context, ast.cmpop, ast.boolop, ast.unaryop),
        ):
            return None
    return (ast.dump(test), frozenset(names), value) if names else None


_ORDER = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _value_test(test) -> tuple | None:
    """(name, constants, predicate) for a test of one local name against integer constants: `rank == 0`,
    `local_rank not in [-1, 0]`, `not rank > 1`. Paths evaluate such tests on the values the name may hold,
    so `if local_rank not in [-1, 0]:` ... `if local_rank == 0:` take arms that agree (YOLOv5's
    torch_distributed_zero_first)."""
    negate = False
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negate = test.operand, not negate
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, type(test.ops[0]), test.comparators[0]
    if isinstance(right, ast.Name) and _int(left) is not None and op in _ORDER:
        left, right, sym = right, left, _FLIPPED[_ORDER[op]]
    elif isinstance(left, ast.Name) and op in _ORDER and _int(right) is not None:
        sym = _ORDER[op]
    elif isinstance(left, ast.Name) and op in (ast.In, ast.NotIn) and isinstance(right, (ast.List, ast.Tuple, ast.Set)):
        members = [_int(e) for e in right.elts]
        if None in members:
            return None
        inside = frozenset(members)
        return left.id, inside, (lambda v: (v in inside) != (op is ast.NotIn) != negate)
    else:
        return None
    if not isinstance(left, ast.Name):
        return None
    k = _int(right)
    compare = {
        "==": lambda v: v == k,
        "!=": lambda v: v != k,
        "<": lambda v: v < k,
        "<=": lambda v: v <= k,
        ">": lambda v: v > k,
        ">=": lambda v: v >= k,
    }[sym]
    return left.id, frozenset({k}), (lambda v: compare(v) != negate)


def _int(node) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return None if inner is None else -inner
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _assigned(node) -> set:
    """Local names a statement (and what it holds) may bind."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            out.update(n.names)
    return out


def _token(c, node) -> tuple:
    """A collective as paths compare it: its op family and its group. Where no `group=` is written,
    the call's own text stands for the group (`dist.barrier()` and `dist.barrier(self.pp_group)` are
    not the same collective); a call that reaches one through helpers is also named by its callee,
    whose further collectives the op alone does not show."""
    group = c.group or ast.unparse(_without_options(node))
    return (c.op, group, c.chain[0][2] if c.chain else "")


# Keywords that say how a collective runs, not which one it is or on what group: YOLOv5's
# `barrier(device_ids=[local_rank])` before the yield and `barrier(device_ids=[0])` after it match.
_OPTIONS = frozenset({"device_ids", "async_op", "timeout", "wait_all_ranks"})


def _without_options(node: ast.Call) -> ast.Call:
    if not any(k.arg in _OPTIONS for k in node.keywords):
        return node
    return ast.Call(node.func, node.args, [k for k in node.keywords if k.arg not in _OPTIONS])


def _reraises(handler: ast.ExceptHandler) -> bool:
    """A handler whose last statement raises and which returns nowhere."""
    return (
        bool(handler.body)
        and isinstance(handler.body[-1], ast.Raise)
        and not any(isinstance(n, ast.Return) for n in ast.walk(handler))
    )


def _in_order(s) -> list | None:
    """The statements a `try` runs on every path that goes on after it, in order, where that is one
    list: every handler ends by raising (a path through one is fatal for the rank, as a `raise` is:
    OLMo-core's checkpoint conversion, `except Exception: barrier(); raise`), so what follows sees the
    body, the `else` and the `finally`. A `return` in the body or `else` would run the `finally` on its
    way out, which a path that stops at the `return` does not show: not followed."""
    if not isinstance(s, ast.Try) or not all(_reraises(h) for h in s.handlers):
        return None
    if s.finalbody and any(isinstance(n, ast.Return) for part in (s.body, s.orelse) for x in part for n in ast.walk(x)):
        return None
    return [*s.body, *s.orelse, *s.finalbody]


class Paths:
    """Path sequences of one function FN, whose collective calls are COLLECTIVES (walker events)."""

    def __init__(self, fn, collectives: list):
        self.fn = fn
        calls = {(n.lineno, n.col_offset + 1): n for n in ast.walk(fn) if isinstance(n, ast.Call)}
        self.sites = {}
        for c in collectives:
            node = calls.get((c.line, c.col))
            if node is not None:
                self.sites[(c.line, c.col)] = (c.pos, _token(c, node))
        self.memo: dict = {}
        self.ranks: frozenset = frozenset()  # names holding a local rank in the question asked (converges)
        self.constants: dict = {}  # name -> the integer constants it is tested against
        for n in ast.walk(fn):
            vt = _value_test(n) if isinstance(n, ast.Compare) else None
            if vt is not None:
                self.constants[vt[0]] = self.constants.get(vt[0], frozenset()) | vt[1]

    def _values(self, name: str) -> frozenset:
        """Values standing for every case of NAME's tests: each constant and its neighbours, and one far
        beyond. A local rank (RANKS) is never negative among processes that share a group: torchrun sets
        LOCAL_RANK on every process, and scripts take -1 for a run without it (`int(os.getenv("LOCAL_RANK",
        -1))`, HF's `args.local_rank == -1`): one process, no peer to diverge from. Not so any rank: a
        weight-sync engine gives ranks outside its group -1 (fp_group_joined_after_exit.py)."""
        vals = {v for k in self.constants.get(name, ()) for v in (k - 1, k, k + 1)} | {10**9}
        return frozenset(v for v in vals if v >= 0 or name not in self.ranks)

    # ---- tokens -------------------------------------------------------------
    def _tokens(self, node, deep: bool = True) -> tuple:
        """The collectives NODE's expressions issue, in order; a collective that may run zero or many
        times there (under `and`/`or`, a conditional expression, in a comprehension or lambda) gives up."""
        found = []

        def visit(n, guarded):
            if isinstance(n, ast.Call):
                site = self.sites.get((n.lineno, n.col_offset + 1))
                if site is not None:
                    if guarded:
                        raise _GiveUp
                    found.append(site)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                return
            if not deep and isinstance(n, ast.stmt) and n is not node:
                return
            inner = guarded or isinstance(
                n, (ast.IfExp, ast.BoolOp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
            )
            for child in ast.iter_child_nodes(n):
                visit(child, inner)

        visit(node, False)
        found.sort()  # the walker's order: arguments before the call that takes them
        return tuple(t for _, t in found)

    def _holds(self, node) -> bool:
        """Whether NODE holds a collective or a `return` (either makes a loop or `try` opaque)."""
        for n in ast.walk(node):
            if isinstance(n, ast.Return):
                return True
            if isinstance(n, ast.Call) and (n.lineno, n.col_offset + 1) in self.sites:
                return True
        return False

    # ---- path states: (sequence, assumptions, done) ---------------------------
    @staticmethod
    def _forget(states: set, names: set) -> set:
        if not names:
            return states
        out = set()
        for seq, assume, done in states:
            if not done:
                assume = frozenset(a for a in assume if not (a[1] & names))
            out.add((seq, assume, done))
        return out

    def _stmts(self, body: list, states: set) -> set:
        for s in body:
            if all(done for *_, done in states):
                break
            states = self._stmt(s, states)
            if len(states) > MAX_PATHS:
                raise _GiveUp
        return states

    def _append(self, states: set, toks: tuple) -> set:
        if not toks:
            return states
        return {(seq + toks if not done else seq, assume, done) for seq, assume, done in states}

    def _branch(self, test, arms: list, states: set) -> set:
        states = self._append(states, self._tokens(test))
        vt = _value_test(test)
        if vt is not None:
            return self._value_branch(vt, arms, states)
        key = _cond_key(test)
        out = set()
        for seq, assume, done in states:
            if done:
                out.add((seq, assume, done))
                continue
            known = next((a[2] for a in assume if key is not None and a[0] == key[0]), None)
            for value, arm in ((True, arms[0]), (False, arms[1])):
                # Assumptions hold the truth of the condition without its `not`s.
                base = key is not None and value == key[2]
                if known is not None and known != base:
                    continue
                a = assume if key is None or known is not None else assume | {(key[0], key[1], base)}
                out |= self._stmts(arm, {(seq, a, False)})
        return out

    def _value_branch(self, vt: tuple, arms: list, states: set) -> set:
        """A branch on a value test: each arm keeps the values of the name for which the test goes its way
        (an assumption forgotten where the name is assigned, as for any condition)."""
        name, _consts, holds = vt
        tag = ("values", name)
        out = set()
        for seq, assume, done in states:
            if done:
                out.add((seq, assume, done))
                continue
            old = next((a for a in assume if a[0] == tag), None)
            possible = old[2] if old is not None else self._values(name)
            base = assume - {old} if old is not None else assume
            for value, arm in ((True, arms[0]), (False, arms[1])):
                kept = frozenset(v for v in possible if holds(v) == value)
                if kept:
                    out |= self._stmts(arm, {(seq, base | {(tag, frozenset({name}), kept)}, False)})
        return out

    def _stmt(self, s, states: set) -> set:
        live = {st for st in states if not st[2]}
        done = states - live
        if isinstance(s, ast.If):
            return done | self._branch(s.test, [s.body, s.orelse], live)
        if isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                live = self._append(live, self._tokens(item.context_expr))
            live = self._forget(
                live, {n for item in s.items if item.optional_vars is not None for n in _assigned(item.optional_vars)}
            )
            return done | self._stmts(s.body, live)
        if isinstance(s, ast.Return):
            toks = self._tokens(s.value) if s.value is not None else ()
            return done | {(seq + toks, assume, True) for seq, assume, _ in live}
        if isinstance(s, ast.Raise):
            return done  # fatal for the rank: the job dies, nobody waits on a hang
        if _in_order(s):
            return done | self._stmts(_in_order(s), live)
        if isinstance(s, (ast.For, ast.AsyncFor, ast.While, ast.Try)) or type(s).__name__ in ("TryStar", "Match"):
            if self._holds(s):
                raise _GiveUp  # its collectives may run any number of times, or be skipped by a `return`
            return done | self._forget(live, _assigned(s))
        if isinstance(s, (ast.Break, ast.Continue)):
            raise _GiveUp  # not reached: the branch is inside no loop (converges() checks)
        return done | self._forget(self._append(live, self._tokens(s)), _assigned(s))

    # ---- the question -------------------------------------------------------
    def _ancestry(self, target) -> list | None:
        """[(statement list, index)] from the function body down to TARGET; None where a loop or a
        `try` encloses it (its continuation is another iteration, or a handler)."""

        def find(body):
            for i, s in enumerate(body):
                if s is target:
                    return [(body, i)]
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                inner = None
                if isinstance(s, ast.If):
                    inner = find(s.body) or find(s.orelse)
                elif isinstance(s, (ast.With, ast.AsyncWith)):
                    inner = find(s.body)
                elif _in_order(s):
                    # a `try:` ... `finally:` (LLaMA-Factory's rank-0-first context manager, whose main rank's
                    # barrier is in the `finally` after the yield): its statements in the order they run
                    inner = find(_in_order(s))
                elif any(n is target for n in ast.walk(s)):
                    return None  # in a loop, a try or a match: not followed
                if inner:
                    return [(body, i)] + inner
            return None

        return find(self.fn.body)

    def converges(self, branch, ranks: frozenset = frozenset()) -> bool:
        """Whether the divergence at the `if` statement BRANCH is made up on every path: every path to
        the function's exit from BRANCH, or from an `if` that every path to BRANCH passes through first
        (one enclosing it, or an earlier test of the same local names: `if should_block:` ahead of
        `if not should_block:`), issues the same sequence of collectives. Ranks that agreed up to that
        `if` then issue the same collectives to the end, whichever arms they take at BRANCH. RANKS: the
        names that hold the deciding local rank (never negative, _values)."""
        if ranks != self.ranks:
            self.ranks, self.memo = ranks, {}
        chain = self._ancestry(branch)
        if not chain:
            return False
        key = _cond_key(branch.test)
        subject = _value_test(branch.test)
        for level, (body, i) in enumerate(chain):
            if level < len(chain) - 1 and isinstance(body[i], ast.If) and self._converges(body[i]):
                return True  # an enclosing `if`
            for s in body[:i]:
                if not isinstance(s, ast.If):
                    continue
                other, tested = _cond_key(s.test), _value_test(s.test)
                same = (key is not None and other is not None and other[0] == key[0]) or (
                    subject is not None and tested is not None and tested[0] == subject[0]
                )
                if same and self._converges(s):
                    return True
        return self._converges(branch)

    def _converges(self, branch) -> bool:
        if id(branch) in self.memo:
            return self.memo[id(branch)]
        ok = False
        chain = self._ancestry(branch)
        if chain:
            try:
                # The branch first, then what follows it at each level out to the function body.
                (body, i), rest = chain[-1], chain[:-1]
                states = self._stmts(body[i:], {((), frozenset(), False)})
                for body, i in reversed(rest):
                    states = self._stmts(body[i + 1 :], states)
                ok = len({seq for seq, *_ in states}) <= 1
            except (_GiveUp, RecursionError):
                ok = False
        self.memo[id(branch)] = ok
        return ok

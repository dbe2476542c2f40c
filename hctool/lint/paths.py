"""Whether a rank-local branch really makes ranks diverge: the collective sequences of every path
from the branch to the function's exit (or, for a branch inside a loop, to the end of the turn).

A branch on a rank id that issues a barrier before a `yield` on one side and after it on the other,
or `if rank != 0: barrier(); return` ahead of one barrier that every other path reaches, gates
collectives and yet every rank issues the same sequence: what the arms issue differs, where they
issue it does not matter. The walker's per-branch comparison (shapes._same_ops) cannot see that;
this module enumerates the paths from the branch and compares their sequences of collectives, each
named by (op, group expression).

Two kinds of condition meet on a path. Those that vary with the deciding source (a rank id in
their taint where a rank id decides: walker.cond_kinds, checks.converges) are what sets ranks apart:
paths through either arm are compared with each other. Every other condition (a flag, a file's
existence, the backend) is held fixed: ranks are compared only on paths that took the same arms of
those, where both evaluated them (`if args.distributed and get_rank() != 0: barrier()` ... `if
args.distributed and get_rank() == 0: barrier()`: with the flag off nobody waits, with it on
everybody waits once). A condition evaluated again is the same condition while nothing assigns what
it reads (versions, `_forget`); tests of one name (or one `get_rank()`) against integer constants are
evaluated on the values it may hold (`_values`).

It answers "converges" only when it can follow every path: anything it cannot (a `try` around the
branch whose handlers swallow, a loop or `try` after it that holds a collective or a `return`, a
`break` or `return` in the loop around it, a collective under a short-circuit or in a comprehension,
more paths than MAX_PATHS) answers "no", and the finding stays.
"""

from __future__ import annotations

import ast

from hctool.lint import names as N

MAX_PATHS = 256
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


class _GiveUp(Exception):
    pass


# A comparison and its negation, keyed by the first (paths correlate `x != y` with `x == y`).
_NEGATED = {ast.NotEq: ast.Eq, ast.IsNot: ast.Is, ast.NotIn: ast.In, ast.GtE: ast.Lt, ast.LtE: ast.Gt}
_ORDER = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FLIPPED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_LOCAL_SHAPES = (
    ast.Compare,
    ast.BoolOp,
    ast.UnaryOp,
    ast.Constant,
    ast.expr_context,
    ast.cmpop,
    ast.boolop,
    ast.unaryop,
)


def _subject(node) -> str | None:
    """What a value test is about: a local or field path (names.dotted: it changes only where it is
    assigned), or a rank id asked of the process group
    (`dist.get_rank()`, `bagua.get_rank()`: the same answer each time it is asked in one run)."""
    text = N.dotted(node)
    if text is not None:
        return text
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Name, ast.Attribute))
        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) in N.RANK_CALLS
        and all(N.dotted(a) is not None or isinstance(a, ast.Constant) for a in node.args)
        and not node.keywords
    ):
        return ast.unparse(node)
    return None


def _reads(node) -> frozenset:
    """The locals and field paths an expression reads (what an assignment in between invalidates)."""
    out = set()
    for n in ast.walk(node):
        d = N.dotted(n) if isinstance(n, (ast.Name, ast.Attribute)) else None
        if d is not None:
            out.add(d)
            out.add(d.split(".", 1)[0])
    return frozenset(out)


def _cond_key(test) -> tuple | None:
    """(key, value) of a condition on locals, field paths and rank ids only: `x`, `not x`, `rank != src`,
    `args.distributed`. A comparison and its negation share one key (`rank != src` is `not (rank == src)`:
    the two tests of ignite's one_rank_first are one condition)."""
    value = True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, value = test.operand, not value
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _NEGATED:
        test = ast.Compare(test.left, [_NEGATED[type(test.ops[0])]()], test.comparators)
        value = not value
    stack, named = [test], False
    while stack:
        n = stack.pop()
        if _subject(n) is not None:
            named = True
            continue
        if not isinstance(n, _LOCAL_SHAPES):
            return None
        stack.extend(ast.iter_child_nodes(n))
    return (ast.dump(test), value) if named else None


def _value_test(test) -> tuple | None:
    """(subject, constants, predicate) for a test of one subject (_subject) against integer constants:
    `rank == 0`, `local_rank not in [-1, 0]`, `not dist.get_rank() > 1`. Paths evaluate such tests on
    the values the subject may hold, so `if local_rank not in [-1, 0]:` ... `if local_rank == 0:` take
    arms that agree (YOLOv5's torch_distributed_zero_first)."""
    negate = False
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negate = test.operand, not negate
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, type(test.ops[0]), test.comparators[0]
    if _subject(right) is not None and _int(left) is not None and op in _ORDER:
        left, right, sym = right, left, _FLIPPED[_ORDER[op]]
    elif op in _ORDER and _int(right) is not None:
        sym = _ORDER[op]
    elif op in (ast.In, ast.NotIn) and isinstance(right, (ast.List, ast.Tuple, ast.Set)):
        members = [_int(e) for e in right.elts]
        subject = _subject(left)
        if None in members or subject is None:
            return None
        inside = frozenset(members)
        return subject, inside, (lambda v: (v in inside) != (op is ast.NotIn) != negate)
    else:
        return None
    subject = _subject(left)
    if subject is None:
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
    return subject, frozenset({k}), (lambda v: compare(v) != negate)


def _int(node) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return None if inner is None else -inner
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _assigned(node) -> set:
    """Locals and field paths a statement (and what it holds) may bind."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            d = N.dotted(n)
            if d is not None:
                out.add(d)
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


_RAISE = ast.Raise(exc=None, cause=None)


class Paths:
    """Path sequences of one function FN, whose collective calls are COLLECTIVES (walker events).
    EVALUATED: ids of the conditions the walker evaluated; VARYING: those of them that vary with the
    deciding source (a rank id in the taint of a rank-id decision). Any other condition is held fixed."""

    def __init__(self, fn, collectives: list, evaluated: frozenset = frozenset(), varying: frozenset = frozenset()):
        self.fn = fn
        self.evaluated, self.varying = evaluated, varying
        calls = {(n.lineno, n.col_offset + 1): n for n in ast.walk(fn) if isinstance(n, ast.Call)}
        self.sites = {}
        for c in collectives:
            node = calls.get((c.line, c.col))
            if node is not None:
                self.sites[(c.line, c.col)] = (c.pos, _token(c, node))
        self.memo: dict = {}
        self.ranks: frozenset = frozenset()  # subjects holding a local rank in the question asked (converges)
        self.turn = False  # comparing one turn of a loop: `continue` ends a path, `break` and `return` give up
        self.constants: dict = {}  # subject -> the integer constants it is tested against
        for n in ast.walk(fn):
            vt = _value_test(n) if isinstance(n, ast.Compare) else None
            if vt is not None:
                self.constants[vt[0]] = self.constants.get(vt[0], frozenset()) | vt[1]

    def _values(self, subject: str) -> frozenset:
        """Values standing for every case of SUBJECT's tests: each constant and its neighbours, and one far
        beyond. A local rank (RANKS) is never negative among processes that share a group: torchrun sets
        LOCAL_RANK on every process, and scripts take -1 for a run without it (`int(os.getenv("LOCAL_RANK",
        -1))`, HF's `args.local_rank == -1`): one process, no peer to diverge from. Not so any rank: a
        weight-sync engine gives ranks outside its group -1 (fp_group_joined_after_exit.py)."""
        vals = {v for k in self.constants.get(subject, ()) for v in (k - 1, k, k + 1)} | {10**9}
        return frozenset(v for v in vals if v >= 0 or subject not in self.ranks)

    # ---- tokens -------------------------------------------------------------
    def _tokens(self, node, deep: bool = True) -> tuple:
        """The collectives NODE's expressions issue, in order; a collective that may run zero or many
        times there (under `and`/`or`, a conditional expression, in a comprehension or lambda) gives up."""
        found = []
        stack = [(node, False)]
        while stack:
            n, guarded = stack.pop()
            if isinstance(n, ast.Call):
                site = self.sites.get((n.lineno, n.col_offset + 1))
                if site is not None:
                    if guarded:
                        raise _GiveUp
                    found.append(site)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if not deep and isinstance(n, ast.stmt) and n is not node:
                continue
            inner = guarded or isinstance(
                n, (ast.IfExp, ast.BoolOp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
            )
            stack.extend((child, inner) for child in ast.iter_child_nodes(n))
        found.sort()  # the walker's order: arguments before the call that takes them
        return tuple(t for _, t in found)

    def _holds(self, node) -> bool:
        """Whether NODE holds a collective, or a way out of it (_escapes)."""
        return self._escapes(node) or any(
            isinstance(n, ast.Call) and (n.lineno, n.col_offset + 1) in self.sites for n in ast.walk(node)
        )

    @staticmethod
    def _escapes(node) -> bool:
        """Whether NODE holds a `return`, or a `break`/`continue` of a loop around it (fetch_each's `except
        FileNotFoundError: continue`): paths through it go on elsewhere than after it."""
        stack = [(node, False)]
        while stack:
            n, looped = stack.pop()
            if isinstance(n, ast.Return) or (isinstance(n, (ast.Break, ast.Continue)) and not looped):
                return True
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            inner = looped or isinstance(n, _LOOPS)  # a loop's own break and continue stay inside it
            stack.extend((child, inner) for child in ast.iter_child_nodes(n))
        return False

    # ---- path states: (sequence, facts, done) ----------------------------------
    # Facts: (("v", name), n) the times NAME was assigned on the path; (key, kind, value) the arm a
    # condition took, KEY naming it with the versions of what it reads, KIND "rank" or "world".
    @staticmethod
    def _forget(states: set, names: set) -> set:
        if not names:
            return states
        out = set()
        for seq, facts, done in states:
            if not done:
                version = dict(f for f in facts if f[0][0] == "v")
                facts = frozenset(f for f in facts if not (f[0][0] == "v" and f[0][1] in names)) | {
                    (("v", n), version.get(("v", n), 0) + 1) for n in names
                }
            out.add((seq, facts, done))
        return out

    @staticmethod
    def _versions(facts: frozenset, reads: frozenset) -> tuple:
        version = dict(f for f in facts if f[0][0] == "v")
        return tuple(sorted((n, version.get(("v", n), 0)) for n in reads))

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
        return {(seq + toks if not done else seq, facts, done) for seq, facts, done in states}

    def _branch(self, test, arms: list, states: set) -> set:
        """`if TEST: arms[0] else: arms[1]`. `a and b` is `a` then `b` (`a or b`: `a`, else `b`), each its own
        condition; `not` swaps the arms."""
        states = self._append(states, self._tokens(test))
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.BoolOp):
            return self._branch(test.operand, [arms[1], arms[0]], states)
        if isinstance(test, ast.BoolOp) and len(test.values) >= 2:
            first = test.values[0]
            rest = test.values[1] if len(test.values) == 2 else ast.BoolOp(test.op, test.values[1:])
            inner = [ast.If(rest, arms[0], arms[1])]
            return self._branch(first, [inner, arms[1]] if isinstance(test.op, ast.And) else [arms[0], inner], states)
        atom = test
        while isinstance(atom, ast.UnaryOp) and isinstance(atom.op, ast.Not):
            atom = atom.operand
        # Held fixed only what the walker saw and found not to vary with the deciding source.
        kind = "world" if id(atom) in self.evaluated and id(atom) not in self.varying else "rank"
        vt = _value_test(test)
        out = set()
        for seq, facts, done in states:
            if done:
                out.add((seq, facts, done))
                continue
            if vt is not None:
                subject, _consts, holds = vt
                key = ("values", subject, self._versions(facts, _reads(test)))
                old = next((f for f in facts if f[0] == key), None)
                possible = old[2] if old is not None else self._values(subject)
                base = facts - {old} if old is not None else facts
                for value, arm in ((True, arms[0]), (False, arms[1])):
                    kept = frozenset(v for v in possible if holds(v) == value)
                    if kept:
                        out |= self._stmts(arm, {(seq, base | {(key, kind, kept)}, False)})
                continue
            ck = _cond_key(test)
            if ck is None and kind == "rank":
                # a rank-dependent call or field that may change between two tests: not correlated
                name, truth = ("once", id(test)), True
            else:
                name, truth = ck if ck is not None else (ast.dump(test), True)
            key = ("cond", name, self._versions(facts, _reads(test)))
            known = next((f[2] for f in facts if f[0] == key), None)
            for value, arm in ((True, arms[0]), (False, arms[1])):
                base = value == truth  # facts hold the truth of the condition without its `not`s
                if known is not None and known != base:
                    continue
                out |= self._stmts(arm, {(seq, facts | {(key, kind, base)}, False)})
        return out

    def _stmt(self, s, states: set) -> set:
        live = {st for st in states if not st[2]}
        done = states - live
        if isinstance(s, ast.If):
            return done | self._branch(s.test, [s.body, s.orelse], live)
        if isinstance(s, ast.Assert):
            return done | self._branch(s.test, [[], [_RAISE]], live)  # a failed assert is fatal, as a raise is
        if isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                live = self._append(live, self._tokens(item.context_expr))
            live = self._forget(
                live, {n for item in s.items if item.optional_vars is not None for n in _assigned(item.optional_vars)}
            )
            return done | self._stmts(s.body, live)
        if isinstance(s, ast.Return):
            if self.turn:
                raise _GiveUp  # it leaves the loop: what the other paths do after the loop is not compared
            toks = self._tokens(s.value) if s.value is not None else ()
            return done | {(seq + toks, facts, True) for seq, facts, _ in live}
        if isinstance(s, ast.Raise):
            return done  # fatal for the rank: the job dies, nobody waits on a hang
        if _in_order(s):
            return done | self._stmts(_in_order(s), live)
        if isinstance(s, _LOOPS) and not self._escapes(s) and self._holds(s):
            # A loop every path that reaches it runs, reading the same values (the versions of what it reads):
            # one token. How often it turns, and what each turn issues, are its own findings (its header,
            # its branches); the branch compared here changes nothing in it (EDM's FID: rank 0 loads first,
            # then every rank runs the batch loop and its barriers).
            reads = _reads(s)
            live = {(seq + (("loop", s.lineno, self._versions(facts, reads)),), facts, False) for seq, facts, _ in live}
            return done | self._forget(live, _assigned(s))
        if isinstance(s, (*_LOOPS, ast.Try)) or type(s).__name__ in ("TryStar", "Match"):
            if self._holds(s):
                raise _GiveUp  # its collectives may be skipped by its handler, or by a `return`
            return done | self._forget(live, _assigned(s))
        if isinstance(s, ast.Continue) and self.turn:
            return done | {(seq, facts, True) for seq, facts, _ in live}  # the end of this turn
        if isinstance(s, (ast.Break, ast.Continue)):
            raise _GiveUp  # a `break` leaves the loop (or, not in a turn, the branch is inside no loop)
        return done | self._forget(self._append(live, self._tokens(s)), _assigned(s))

    # ---- the question -------------------------------------------------------
    def _ancestry(self, target) -> list | None:
        """[(statement list, index)] from the function body down to TARGET; None where a `try` that
        swallows encloses it (its continuation is a handler). A loop's body starts a new list: the
        comparison of a branch inside it is of one turn (converges)."""

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
                elif isinstance(s, _LOOPS):
                    inner = find(s.body)
                elif _in_order(s):
                    # a `try:` ... `finally:` (LLaMA-Factory's rank-0-first context manager, whose main rank's
                    # barrier is in the `finally` after the yield): its statements in the order they run
                    inner = find(_in_order(s))
                elif any(n is target for n in ast.walk(s)):
                    return None  # in a swallowing try or a match: not followed
                if inner:
                    return [(body, i)] + inner
            return None

        return find(self.fn.body)

    def _scope(self, chain: list) -> tuple[list, bool]:
        """The levels of CHAIN inside the innermost loop around the target (and whether there is one)."""
        loops = [k for k, (body, i) in enumerate(chain[:-1]) if isinstance(body[i], _LOOPS)]
        return (chain[loops[-1] + 1 :], True) if loops else (chain, False)

    def converges(self, branch, ranks: frozenset = frozenset()) -> bool:
        """Whether the divergence at the `if` statement BRANCH is made up on every path: every path to
        the function's exit (or the end of the loop turn) from BRANCH, or from an `if` that every path
        to BRANCH passes through first (one enclosing it, or an earlier test of the same subject:
        `if should_block:` ahead of `if not should_block:`), issues the same sequence of collectives
        wherever the conditions held fixed agree. Ranks that agreed up to that `if` then issue the
        same collectives to the end, whichever arms they take at BRANCH. RANKS: the subjects that hold
        the deciding local rank (never negative, _values)."""
        if ranks != self.ranks:
            self.ranks, self.memo = ranks, {}
        chain = self._ancestry(branch)
        if not chain:
            return False
        chain, _ = self._scope(chain)
        for level, (body, i) in enumerate(chain):
            if level < len(chain) - 1 and isinstance(body[i], ast.If) and self._converges(body[i]):
                return True  # an enclosing `if`
            for s in body[:i]:
                if isinstance(s, ast.If) and self._same_subject(s.test, branch.test) and self._converges(s):
                    return True
        return self._converges(branch)

    @staticmethod
    def _same_subject(earlier, test) -> bool:
        """Whether the test EARLIER and the branch's TEST share a condition or a subject (`and`/`or` operands
        of either included): `if should_block:` ahead of `if not should_block:`, `if flag and rank != 0:`
        ahead of `if flag and rank == 0:`."""

        def parts(t) -> list:
            return [p for v in t.values for p in parts(v)] if isinstance(t, ast.BoolOp) else [t]

        def marks(t) -> set:
            out = set()
            for part in parts(t):
                ck, vt = _cond_key(part), _value_test(part)
                if ck is not None:
                    out.add(("cond", ck[0]))
                if vt is not None:
                    out.add(("subject", vt[0]))
            return out

        return bool(marks(earlier) & marks(test))

    def _converges(self, branch) -> bool:
        if id(branch) in self.memo:
            return self.memo[id(branch)]
        ok = False
        chain = self._ancestry(branch)
        if chain:
            chain, self.turn = self._scope(chain)
            try:
                # The branch first, then what follows it at each level out to the function body (or the
                # loop's body: the end of the turn).
                (body, i), rest = chain[-1], chain[:-1]
                states = self._stmts(body[i:], {((), frozenset(), False)})
                for body, i in reversed(rest):
                    states = self._stmts(body[i + 1 :], states)
                ok = _agree(states)
            except (_GiveUp, RecursionError):
                ok = False
            finally:
                self.turn = False
        self.memo[id(branch)] = ok
        return ok


def _agree(states: set) -> bool:
    """Every two paths that took the same arms of the conditions held fixed (where both tested them)
    issue the same collectives."""
    worlds = []
    for seq, facts, _ in states:
        held = {f[0]: f[2] for f in facts if len(f) == 3 and f[1] == "world"}
        worlds.append((seq, held))
    for k, (seq, held) in enumerate(worlds):
        for seq2, held2 in worlds[k + 1 :]:
            if seq == seq2:
                continue
            if all(_meet(held[x], held2[x]) for x in held.keys() & held2.keys()):
                return False
    return True


def _meet(a, b) -> bool:
    return bool(a & b) if isinstance(a, frozenset) else a == b

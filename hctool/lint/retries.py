"""A poll that is retried (issue 34, class 2): `if not self.work.is_completed(): return` ahead of the
function's collectives, in a function that is called again until the work is done.

    def step(self):
        if not self.pending.done():
            return                     # nothing done, nothing said: the caller cannot act on it
        result = self.pending.result()
        self.pending = None            # consumed: the next call starts the next round
        dist.all_reduce(result)

Each rank issues the all_reduce exactly once per future it polls, at the call where it sees the future
done; a rank that sees it later issues the same all_reduce later. That is no divergence as long as
nothing else of the program issues collectives between one call and the next, which is why the callers
are checked too (Project.retried_alone): a caller that issues collectives of its own interleaves them
with this one at a time that differs per rank (SGLang's `is_load_back_event_done` returns False and
its callers go on to other collectives: a finding). What this module decides is the shape within the
function:

- the poll is the whole condition of the `if` that holds the `return` (`not R.done()`, `R.done() is
  False`), R a field of the object or a local read from one (`fut = self.futures[0]`);
- the `return` returns nothing (a bare `return` or `return None`), so callers cannot branch on what
  the poll saw;
- nothing before the `if` in the function is a statement with effects other than reading R (an
  assignment of a local, a docstring); and
- after the `if`, the function consumes the field R was read from: assigns it, deletes it, or
  changes it in place (`self.futures.pop(0)`, `self.pending = None`), so it is polled again until done
  and then replaced, never acted on twice.
"""

from __future__ import annotations

import ast

from hctool.lint import names as N
from hctool.lint import sources as S

POLLS = frozenset({"done", "is_completed", "query", "is_set"})


def _field(expr) -> str | None:
    """The object field an expression reads, subscripts and calls dropped (`self.futures[0]` ->
    `self.futures`); None when it is not a field of `self`."""
    while isinstance(expr, (ast.Subscript, ast.Call)):
        expr = expr.value if isinstance(expr, ast.Subscript) else expr.func
    d = N.dotted(expr)
    return d if d is not None and d.startswith("self.") else None


def _polled(test) -> ast.expr | None:
    """R of a test that is nothing but "R is not done yet"."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        call = test.operand
    elif (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Is, ast.Eq))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is False
    ):
        call = test.left
    else:
        return None
    if (
        isinstance(call, ast.Call)
        and not call.args
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in POLLS
    ):
        return call.func.value
    return None


def _bare_return(stmts: list) -> bool:
    return (
        len(stmts) == 1
        and isinstance(stmts[0], ast.Return)
        and (stmts[0].value is None or isinstance(stmts[0].value, ast.Constant) and stmts[0].value.value is None)
    )


def _consumes(stmts: list, fld: str) -> bool:
    for stmt in stmts:
        for n in ast.walk(stmt):
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
                if any(_field(t) == fld for t in targets):
                    return True
            elif (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr in S.MUTATORS
                and N.dotted(n.func.value) == fld
            ):
                return True
    return False


def retried_poll(fn_node, if_line: int) -> bool:
    """Whether the `if` at IF_LINE, a top-level statement of FN_NODE, is a retried poll (above)."""
    if fn_node is None:
        return False
    body = list(fn_node.body)
    idx = next((i for i, s in enumerate(body) if isinstance(s, ast.If) and s.lineno == if_line), None)
    if idx is None:
        return False
    stmt = body[idx]
    polled = _polled(stmt.test)
    if polled is None or stmt.orelse or not _bare_return(stmt.body):
        return False
    local: dict[str, str] = {}
    for before in body[:idx]:
        if isinstance(before, ast.Expr) and isinstance(before.value, ast.Constant):
            continue  # the docstring
        if (
            isinstance(before, ast.Assign)
            and len(before.targets) == 1
            and isinstance(before.targets[0], ast.Name)
            and _field(before.value) is not None
        ):
            local[before.targets[0].id] = _field(before.value)
            continue
        if isinstance(before, ast.If) and _bare_return(before.body) and not before.orelse:
            continue  # `if self.pending is None: return`: nothing to poll yet, nothing done
        return False
    fld = local.get(polled.id) if isinstance(polled, ast.Name) else _field(polled)
    return fld is not None and _consumes(body[idx + 1 :], fld)


def consumed_event(if_node) -> bool:
    """`if self.event.is_set(): <collectives>; self.event.clear()`, no `else` (issue 34, class 2, a latch
    handed from one task to another): the arm consumes the event it polled, so it acts once per `set()`
    and a rank that sees the event later acts later. checks.py asks the rest: that the `if` sits in a loop
    that polls it again (a `while`), and that nothing else in that loop issues collectives, which a rank
    seeing the event one turn later would interleave with this arm's in another order."""
    if not isinstance(if_node, ast.If) or if_node.orelse:
        return False
    test = if_node.test
    if not (isinstance(test, ast.Call) and not test.args and isinstance(test.func, ast.Attribute)):
        return False
    if test.func.attr != "is_set":
        return False
    event = N.dotted(test.func.value)
    if event is None:
        return False
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "clear"
        and N.dotted(n.func.value) == event
        for stmt in if_node.body
        for n in ast.walk(stmt)
    )

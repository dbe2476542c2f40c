"""Memoized collectives: a method that issues its collective only while a field is unset and sets it
there, in a class that also has a finalizer issuing it if nobody did (SGLang's
PrefillDelayerSinglePassExecutor: `negotiate_should_allow_prefill` gathers on its first call of a pass,
`finalize()` gathers if no call did). Every rank then issues it exactly once per object, however
often or rarely its callers call it, so those calls are not collective sites of the callers.

Pass 1 marks each call with the latch it sits under (`if self._result is None:`, `if not
self._called:` with `_called` a property reading `_result`); the project decides which methods are
memoized once the collective sites are known.
"""

from __future__ import annotations

import ast


def latch_properties(cls: ast.ClassDef) -> dict[str, str]:
    """Properties that only say whether a field is set: `return self.F is not None` -> {name: F}."""
    out = {}
    for item in cls.body:
        if not isinstance(item, ast.FunctionDef) or len(item.body) != 1 or not isinstance(item.body[0], ast.Return):
            continue
        if not any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
            continue
        field = _set_test(item.body[0].value, {})
        if field:
            out[item.name] = field
    return out


def _self_field(node) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _set_test(node, props: dict) -> str | None:
    """The field F when NODE is true exactly when self.F is set."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool" and node.args:
        node = node.args[0]
    if (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.IsNot)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    ):
        node = node.left
    name = _self_field(node)
    if name is None:
        return None
    return props.get(name, name)


def unset_field(test, props: dict) -> str | None:
    """The field F when TEST is true exactly when self.F is unset: `not self.F`, `self.F is None`,
    `not self.P` for a latch property P."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _set_test(test.operand, props)
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Is)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        name = _self_field(test.left)
        return props.get(name, name) if name else None
    return None


def memoized(project, candidates: dict) -> set:
    """Of CANDIDATES {method key: field} (methods that set their latch and have a finalizer), those whose
    every collective-reaching call (and direct collective) sits under their latch."""
    out = set()
    for key, fld in candidates.items():
        f = project.funcs[key]
        if f.direct and f.direct_latch != fld:
            continue
        if any(
            latch != fld and any(t in project.coll for t in project.resolve(ref))
            for ref, _line, _display, _consts, _col, _per_arg, latch in f.calls
        ):
            continue
        out.add(key)
    return out


def has_finalizer(project, key: str, fld: str) -> bool:
    """Another method of the class family calls KEY under the same latch: `if not self._called: self.m()`."""
    cid = project.funcs[key].cid
    if cid is None:
        return False
    for c in project.family(cid):
        for other in project.classes.get(c, ((), {}))[1].values():
            g = project.funcs.get(other)
            if g is None or other == key:
                continue
            if any(latch == fld and key in project.resolve(ref) for ref, *_rest, latch in g.calls):
                return True
    return False

"""Receiver types: which project classes a call's receiver can be, so methods never resolve by name alone.

A type is a frozenset of specs, solved by project.Project.classes_of:
  ("q", module, "pkg.mod.Cls")      a class named by an annotation or a constructor call
  ("self", module, "Cls")           `self` inside class Cls (a subclass at run time)
  ("new", module, "pkg.mod.Cls")    an object built by calling Cls: exactly that class, no subclass
  ("attr", frozenset(specs), "x")   field `x` of an object of those types
  ("open",)                         a field also assigned something of unknown type
Specs come from parameter annotations, `x = Cls(...)`, `self.x = ...` and class-body field annotations.
"""

from __future__ import annotations

import ast

from hctool.lint import names as N

# Generic wrappers whose arguments are the interesting types (Optional[Cls], List[Cls], ...).
_WRAPPERS = frozenset(
    {
        "Optional",
        "Union",
        "List",
        "list",
        "Sequence",
        "Iterable",
        "Iterator",
        "Deque",
        "deque",
        "Set",
        "set",
        "Tuple",
        "tuple",
        "Type",
        "Final",
        "ClassVar",
        "Annotated",
        "Dict",
        "dict",
    }
)
OPEN = frozenset({("open",)})
# Annotations that name no project class: skip quickly.
_SKIP = frozenset({"int", "float", "str", "bool", "bytes", "None", "Any", "object", "Callable"})


def annotation(node, imports: dict, modname: str, local_defs: frozenset) -> frozenset:
    """Specs named by an annotation: `Cls`, `"Cls"`, `Optional[Cls]`, `Cls | None`, `List[Cls]`."""
    out: set = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None:
            continue
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            try:
                stack.append(ast.parse(n.value, mode="eval").body)
            except SyntaxError:
                pass
        elif isinstance(n, ast.BinOp):  # Cls | None
            stack += [n.left, n.right]
        elif isinstance(n, ast.Subscript):
            head = N.dotted(n.value) or ""
            if head.rsplit(".", 1)[-1] in _WRAPPERS:
                stack.append(n.slice)
        elif isinstance(n, ast.Tuple):
            stack += n.elts
        else:
            spec = class_spec(N.dotted(n), imports, modname, local_defs)
            if spec:
                out.add(spec)
    return frozenset(out)


def class_spec(name: str | None, imports: dict, modname: str, local_defs: frozenset) -> tuple | None:
    """("q", module, qualified name) for a name that can denote a project class here."""
    if not name or name in _SKIP:
        return None
    head = name.split(".", 1)[0]
    if head in imports:
        return ("q", modname, N.qualify(name, imports))
    if "." not in name and name in local_defs:
        return ("q", modname, f"{modname}.{name}")
    return None

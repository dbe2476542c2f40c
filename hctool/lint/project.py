"""The whole analyzed tree: symbol tables, call resolution and the two fixpoints.

Resolution is by name, best effort: `self.m()` walks the class hierarchy (and
overrides in subclasses, since `self` may be one), `x.m()` on an unknown
receiver means any class that defines `m` unless the name is generic or too
common. A function that transitively issues a collective is a collective site;
a function whose return value depends on rank-local state taints its callers.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from hctool.lint import names as N
from hctool.lint.walker import EMPTY, AttrAtom, CallAtom, FnAtom, Src


@dataclass
class FuncSummary:
    key: str
    qual: str
    path: str
    line: int
    direct: tuple | None  # (line, name) of its first direct collective
    calls: list  # (ref, line, display)
    ret: frozenset


@dataclass
class ModuleSummary:
    path: str
    modname: str
    lines: int = 0
    funcs: list = field(default_factory=list)
    classes: dict = field(default_factory=dict)  # name -> (bases as qualified names, {method: key})
    module_funcs: dict = field(default_factory=dict)  # name -> key
    attr_assigns: dict = field(default_factory=dict)  # attribute name -> atoms
    wants_check: bool = False  # suppressions or HC104 candidates: check even without collectives
    error: tuple | None = None  # (line, message) when the file could not be analyzed


class Project:
    def __init__(self, modules: list[ModuleSummary]):
        self.funcs: dict[str, FuncSummary] = {}
        self.mod_funcs: dict[str, dict] = {}
        self.classes: dict[tuple, tuple] = {}
        self.class_by_name = defaultdict(list)
        self.methods_by_name = defaultdict(list)
        self.mods_by_tail = defaultdict(list)
        self._memo: dict = {}
        for m in modules:
            self.mods_by_tail[m.modname.rsplit(".", 1)[-1]].append(m.modname)
            self.mod_funcs[m.modname] = m.module_funcs
            for cname, (bases, methods) in m.classes.items():
                self.classes[(m.modname, cname)] = (bases, methods)
                self.class_by_name[cname].append((m.modname, cname))
                for mname, key in methods.items():
                    self.methods_by_name[mname].append(key)
            for f in m.funcs:
                self.funcs[f.key] = f
        self.children = defaultdict(list)
        for cid, (bases, _) in sorted(self.classes.items()):
            for b in bases:
                for parent in self._find_class(b, cid[0]):
                    self.children[parent].append(cid)
        self.coll: dict[str, tuple] = {}  # key -> (line, display, next key or None)
        self.ret_src: dict[str, Src] = {}
        self.attr_src: dict[str, Src] = {}
        self._solve_collectives()
        self._solve_taint(modules)

    # ---- resolution -------------------------------------------------------
    def _find_modules(self, qual: str) -> list[str]:
        if qual in self.mod_funcs:
            return [qual]
        tail = qual.rsplit(".", 1)[-1]
        return [m for m in self.mods_by_tail.get(tail, ()) if m.endswith("." + qual) or qual.endswith("." + m)]

    def _find_class(self, qual: str, from_mod: str) -> list[tuple]:
        if "." not in qual:
            if (from_mod, qual) in self.classes:
                return [(from_mod, qual)]
            found = self.class_by_name.get(qual, [])
            return found if len(found) <= N.MAX_BY_NAME_CANDIDATES else []
        mod, _, name = qual.rpartition(".")
        found = [(m, name) for m in self._find_modules(mod) if (m, name) in self.classes]
        return found or self._find_class(name, from_mod)

    def _mro(self, cid: tuple, name: str, seen: set) -> list[str]:
        if cid in seen or cid not in self.classes:
            return []
        seen.add(cid)
        bases, methods = self.classes[cid]
        if name in methods:
            return [methods[name]]
        for b in bases:
            for parent in self._find_class(b, cid[0]):
                found = self._mro(parent, name, seen)
                if found:
                    return found
        return []

    def _overrides(self, cid: tuple, name: str) -> list[str]:
        out, queue, seen = [], deque(self.children.get(cid, ())), set()
        while queue:
            c = queue.popleft()
            if c in seen:
                continue
            seen.add(c)
            methods = self.classes[c][1]
            if name in methods:
                out.append(methods[name])
            queue.extend(self.children.get(c, ()))
        return out

    def _in_module(self, name: str, mod: str) -> list[str]:
        key = self.mod_funcs.get(mod, {}).get(name)
        if key:
            return [key]
        if (mod, name) in self.classes:  # a constructor call
            return self._mro((mod, name), "__init__", set())
        return []

    def resolve(self, ref: tuple) -> list[str]:
        hit = self._memo.get(ref)
        if hit is not None:
            return hit
        kind, name = ref[0], ref[1]
        out: list[str] = []
        if kind == "local":
            out = self._in_module(name, ref[2])
        elif kind == "imported":
            mod, _, real = ref[2].rpartition(".")
            for m in self._find_modules(mod) if mod else ():
                out += self._in_module(real, m)
        elif kind == "modfunc":
            for m in self._find_modules(ref[2]):
                out += self._in_module(name, m)
            if not out:  # `SomeClass.method(...)` through an imported class
                for cid in self._find_class(ref[2], ""):
                    out += self._mro(cid, name, set())
        elif kind == "self":
            cid = (ref[2], ref[3])
            out = self._mro(cid, name, set()) + self._overrides(cid, name)
        elif kind == "super":
            for b in self.classes.get((ref[2], ref[3]), ((), {}))[0]:
                for parent in self._find_class(b, ref[2]):
                    out += self._mro(parent, name, set())
                if out:
                    break
        elif kind == "method":
            found = self.methods_by_name.get(name, [])
            out = list(found) if len(found) <= N.MAX_BY_NAME_CANDIDATES else []
        out = sorted(set(out))
        self._memo[ref] = out
        return out

    # ---- fixpoints --------------------------------------------------------
    def _solve_collectives(self) -> None:
        callers = defaultdict(list)
        queue = deque()
        for key in sorted(self.funcs):
            f = self.funcs[key]
            if f.direct:
                self.coll[key] = (f.direct[0], f.direct[1], None)
                queue.append(key)
            for ref, line, display in f.calls:
                for target in self.resolve(ref):
                    callers[target].append((key, line, display))
        while queue:  # breadth first: each site keeps its shortest chain
            target = queue.popleft()
            for caller, line, display in callers.get(target, ()):
                if caller not in self.coll:
                    self.coll[caller] = (line, display, target)
                    queue.append(caller)

    def _flatten(self, atoms, srcs: list, deps: list) -> None:
        for a in atoms:
            if isinstance(a, Src):
                srcs.append(a)
            elif isinstance(a, AttrAtom):
                deps.append(("attr", a.name))
            elif isinstance(a, FnAtom):
                deps.append(("fn", a.key))
            elif isinstance(a, CallAtom):
                targets = self.resolve(a.ref)
                deps.extend(("fn", t) for t in targets)
                if not any(t in self.coll for t in targets):  # collective results are replicated
                    self._flatten(a.args, srcs, deps)

    def _solve_taint(self, modules: list[ModuleSummary]) -> None:
        nodes: dict[tuple, frozenset] = {("fn", k): f.ret for k, f in self.funcs.items() if f.ret}
        for m in modules:
            for name, atoms in m.attr_assigns.items():
                nodes[("attr", name)] = nodes.get(("attr", name), EMPTY) | atoms
        rep: dict[tuple, Src] = {}
        dependents = defaultdict(list)
        queue = deque()
        for node in sorted(nodes, key=repr):
            srcs, deps = [], []
            self._flatten(nodes[node], srcs, deps)
            for d in deps:
                dependents[d].append(node)
            if srcs:
                rep[node] = min(srcs)
                queue.append(node)
        while queue:
            node = queue.popleft()
            for dep in dependents.get(node, ()):
                if dep not in rep:
                    rep[dep] = rep[node]
                    queue.append(dep)
        for (kind, name), src in rep.items():
            (self.ret_src if kind == "fn" else self.attr_src)[name] = src

    # ---- facts for pass 2 -------------------------------------------------
    def chain(self, key: str) -> tuple:
        """Hops from function KEY down to the collective it issues: (path, line, message)."""
        hops, seen = [], set()
        while key is not None and key not in seen:
            seen.add(key)
            line, display, nxt = self.coll[key]
            f = self.funcs[key]
            what = f"calls `{display}()`" if nxt else f"issues `{display}()`"
            hops.append((f.path, line, f"`{f.qual}` {what}"))
            key = nxt
        return tuple(hops)

    def call(self, ref: tuple, args: frozenset) -> tuple[tuple, frozenset]:
        targets = self.resolve(ref)
        sites = [t for t in targets if t in self.coll]
        t = frozenset(self.ret_src[k] for k in targets if k in self.ret_src)
        if not sites:
            t = t | args
        return (self.chain(sites[0]) if sites else ()), t

    def attr(self, name: str) -> frozenset:
        src = self.attr_src.get(name)
        return frozenset((src,)) if src else EMPTY

    def module_has_collectives(self, m: ModuleSummary) -> bool:
        return any(f.key in self.coll for f in m.funcs)

"""The project's taint fixpoint: which function results and fields (keyed by class) hold rank-local
values, from the symbolic atoms pass 1 left in summaries, constructor arguments per parameter, and
the fields other threads write. A mixin of project.Project, which holds the tables it reads."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import replace

from hctool.lint import names as N
from hctool.lint import threads
from hctool.lint.shapes import EMPTY, AttrAtom, CallAtom, FnAtom, ParamAtom, Src


class TaintSolver:
    def _flatten(self, atoms, srcs: list, deps: list) -> None:
        for a in atoms:
            if isinstance(a, Src):
                srcs.append(a)
            else:
                s, d = self._flat1(a)
                srcs.extend(s)
                deps.extend(d)

    def _flat1(self, a) -> tuple[tuple, tuple]:
        """(sources, dependencies) of one symbolic atom; the same atoms recur across summaries."""
        hit = self._flat_memo.get(a)
        if hit is not None:
            return hit
        srcs: list = []
        deps: list = []
        if isinstance(a, AttrAtom):
            deps.extend(("attr", k) for k in self.attr_keys(a.specs, a.name))
        elif isinstance(a, FnAtom):
            deps.append(("fn", a.key))
        elif isinstance(a, ParamAtom):
            deps.append(("init", a.key, a.name))
        elif isinstance(a, CallAtom):
            targets = self.resolve(a.ref)
            deps.extend(("fn", t) for t in targets if not t.endswith(".__init__"))
            # Collective results are replicated; a constructed object is not the values it was
            # built from (its fields carry their own taint, keyed by its class).
            if not any(t in self.coll for t in targets) and not self.is_class(a.ref):
                self._flatten(a.args, srcs, deps)
        hit = self._flat_memo[a] = (tuple(srcs), tuple(deps))
        return hit

    def _solve_taint(self, modules: list) -> None:
        nodes: dict[tuple, frozenset] = {("fn", k): f.ret for k, f in self.funcs.items() if f.ret}
        for m in modules:
            for (cname, fname), atoms in m.attr_assigns.items():
                k = ("attr", (m.modname, cname, fname))
                nodes[k] = nodes.get(k, EMPTY) | atoms
        # Fields another thread writes are sources themselves. Those of objects we cannot type are
        # matched by field name where pass 2 reads them, and travel no further (by name they would
        # reach every field so named).
        typed, self.loose_src = threads.thread_writes(self)
        for k, src in typed.items():
            nodes[("attr", k)] = nodes.get(("attr", k), EMPTY) | {src}
        # `self.device = torch.device(kind, index)` keeps the index's taint apart (walker.bind): `F.type` is
        # what the field holds without it, and the field itself has it back for every other read.
        for k in [k for k in nodes if k[0] == "attr" and k[1][2].endswith(N.DEVICE_INDEX_PART)]:
            index = nodes.pop(k)
            mod, cname, fname = k[1]
            whole = ("attr", (mod, cname, fname[: -len(N.DEVICE_INDEX_PART)]))
            nodes[("attr", (mod, cname, whole[1][2] + N.DEVICE_TYPE_PART))] = nodes.get(whole, EMPTY)
            nodes[whole] = nodes.get(whole, EMPTY) | index
        self._attr_nodes = {k[1] for k in nodes if k[0] == "attr"}
        params = {k: v for m in modules for k, v in m.init_params.items()}
        for f in self.funcs.values():  # what each constructor parameter is passed, over all call sites
            for ref, _, _, _, _, per_arg, _ in f.calls:
                if not per_arg:
                    continue
                inits = [t for t in self.resolve(ref) if t.endswith(".__init__")]
                # A dataclass or NamedTuple has no __init__ of its own: its fields take the arguments.
                inits += [f"{self.class_path[c]}:{c[1]}.__init__" for c in self.class_ids(ref) if c in self.class_path]
                positional, keywords = per_arg
                for t in inits:
                    names = params.get(t, [])
                    for name, taint in [*zip(names, positional), *keywords]:
                        if taint:
                            k = ("init", t, name)
                            nodes[k] = nodes.get(k, EMPTY) | taint
        dependents = defaultdict(list)
        direct: dict[tuple, list] = {}
        for node in sorted(nodes, key=repr):
            srcs, deps = [], []
            self._flatten(nodes[node], srcs, deps)
            for d in deps:
                dependents[d].append(node)
            direct[node] = srcs
        # Rank ids never flow out of a function result (see Walker.s_return); rank-local
        # state does. Solve the two separately; a node keeps its most severe source.
        local = self._spread(
            direct, dependents, lambda s: not s.kind.startswith("id"), lambda n, s: s.kind != "thread" or n[0] != "init"
        )
        ids = self._spread(direct, dependents, lambda s: s.kind.startswith("id"), lambda n, s: n[0] == "attr")
        for node in set(local) | set(ids):
            if node[0] == "init":
                continue
            kind, name = node
            src = local.get(node) or ids.get(node)
            (self.ret_src if kind == "fn" else self.attr_src)[name] = src

    @staticmethod
    def _spread(direct: dict, dependents: dict, keep, accepts) -> dict:
        rep, queue = {}, deque()
        for node in direct:  # in repr order: _solve_taint fills DIRECT so
            srcs = [x for x in direct[node] if keep(x) and accepts(node, x)]
            if srcs:
                rep[node] = min(srcs)
                queue.append(node)
        while queue:
            node = queue.popleft()
            src = rep[node]
            for dep in dependents.get(node, ()):
                # Function results count; fields do not, except for what a thread wrote: that stays
                # near the object it was written to (a status read back through one getter and one field).
                hops = src.hops + (dep[0] == "fn" or src.kind == "thread")
                if (
                    dep not in rep
                    and accepts(dep, src)
                    and hops <= (N.MAX_THREAD_HOPS if src.kind == "thread" else N.MAX_HOPS)
                ):
                    rep[dep] = replace(src, hops=hops)
                    queue.append(dep)
        return rep

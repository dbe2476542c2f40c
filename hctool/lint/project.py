"""The whole analyzed tree: symbol tables, call resolution and the two fixpoints.

Resolution follows types, never a method name alone: `self.m()` walks the class
hierarchy (and overrides in subclasses, since `self` may be one); `x.m()` resolves
only when x's class is known (annotation, constructor, a field's declared type),
to that class's method and its subclasses' overrides. A function that
transitively issues a collective is a collective site; a function whose return
value depends on rank-local state taints its callers. Fields are keyed by class.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from hctool.lint import latches
from hctool.lint import names as N
from hctool.lint import sources as S
from hctool.lint.taint import TaintSolver
from hctool.lint.walker import EMPTY, Src


@dataclass
class FuncSummary:
    key: str
    qual: str
    path: str
    line: int
    direct: tuple | None  # (line, name) of its first direct collective
    calls: list  # (ref, line, display, truthy constant args, col, argument taint, latch field)
    ret: frozenset
    mode_exit: tuple | None = None  # (param, position) whose truthy value returns before any collective
    cid: tuple | None = None  # (module, class) of a method
    direct_latch: str | None = None  # the latch its direct collective sits under (latches.py)
    latch_assigned: tuple = ()  # latch fields it sets under their `is None` arm
    spawns: tuple = ()  # (ref, line) of functions it hands to another thread
    writes: tuple = ()  # (receiver specs | None for self | "loose", field, line) it assigns or changes
    state_writes: bool = False  # sets items' state under a per-rank deadline: pass 2 looks (HC104)
    cls: str | None = None  # the enclosing class's name
    span: tuple = (0, 0)  # (first line, decorators included; last line): pass 2 parses just these
    receives: bool = False  # receives messages from another process (a socket's or a pipe's recv)
    direct_dims: frozenset = frozenset()  # the dimensions of its direct collectives' groups (exprs._call_dims)
    frees: tuple = ()  # (pool field, under a per-rank condition, line) of the frees it calls (Project.lagging_pools)
    # (ref, line, the deciding source's (path, line) or None) it calls under a per-rank condition (poll,
    # deadline, swallowed failure)
    gated_refs: tuple = ()
    id_writes: tuple = ()  # (field, the rank-id comparisons it is assigned under, or None) (Project.held_group)
    id_calls: tuple = ()  # (ref, line, the rank-id comparisons) of the calls it makes under rank-id tests


@dataclass(frozen=True)
class Lag:
    """Where a pool is changed at a time of one rank's own: the change (PATH, LINE) and, when the condition
    is not around it, the per-rank call or thread entry it runs under (VIA: path, line)."""

    path: str
    line: int
    via: tuple | None
    cause: tuple | None = None  # the source (path, line) of the condition that call runs under


# How far below a per-rank condition a free still lags with it: `_do_release()` called for each expired
# request, which calls `release_kv_cache()`, which calls the tree cache's `cache_finished_req()` that frees.
LAG_DEPTH = 2


def program_of(modname: str) -> str:
    """The program a module belongs to: its top-level package; top-level modules form one.

    Replicated state lives in the processes that issue collectives, so a tree linted with several
    top-level packages (an engine beside its launcher) is several programs, and a wall-clock
    ordering in one without collectives orders nothing that ranks replicate (HC104).
    """
    return modname.split(".", 1)[0] if "." in modname else ""


@dataclass
class ModuleSummary:
    path: str
    modname: str
    lines: int = 0
    funcs: list = field(default_factory=list)
    classes: dict = field(default_factory=dict)  # name -> (bases as qualified names, {method: key})
    module_funcs: dict = field(default_factory=dict)  # name -> key
    attr_assigns: dict = field(default_factory=dict)  # (class, field) -> atoms
    field_types: dict = field(default_factory=dict)  # (class, field) -> receiver specs
    init_params: dict = field(default_factory=dict)  # constructor key -> positional parameter names
    digest: str = ""  # of the bytes summarized (the cache key)
    imports: dict = field(default_factory=dict)  # what pass 2 needs of the module (walker.ModuleInfo)
    local_defs: frozenset = frozenset()
    latch_props: dict = field(default_factory=dict)
    suppressions: dict = field(default_factory=dict)  # line -> (column, codes, form) of each suppression comment
    actors: tuple = ()  # classes made Ray actors here (`@ray.remote`, `ray.remote(Cls)`): Project.actor_side
    error: tuple | None = None  # (line, message) when the file could not be analyzed


# A call on a declared base type reaches its subclasses' overrides, up to this many. ParlAI's `agent.act()`
# on `Agent` (43 overrides) reached a TorchAgent's fp16 all_reduce from a chat world with no process group
# (issue 34, held-out round 5): past a few dozen implementations, which one runs is the program's
# configuration, not something the code shows at the call.
MAX_OVERRIDES = 24


class Project(TaintSolver):
    def __init__(self, modules: list[ModuleSummary]):
        self.funcs: dict[str, FuncSummary] = {}
        self.mod_funcs: dict[str, dict] = {}
        self.classes: dict[tuple, tuple] = {}
        self.class_by_name = defaultdict(list)
        self.mods_by_tail = defaultdict(list)
        self._memo: dict = {}
        self._cls_memo: dict = {}
        self._flat_memo: dict = {}
        self._found: dict = {}  # _find_modules / _find_class answers: the tables below are fixed once built
        self.field_types: dict[tuple, frozenset] = {}  # (module, class, field) -> specs
        self.class_path: dict[tuple, str] = {}  # classes with generated constructors -> path
        self.global_field = defaultdict(set)  # field -> class specs declared for it anywhere
        self.modules = {m.path: m for m in modules}
        for m in modules:
            for (cname, fname), specs in m.field_types.items():
                self.field_types[(m.modname, cname, fname)] = specs
                self.global_field[fname] |= {("q", *sp[1:]) for sp in specs if sp[0] in ("q", "new")}
            self.mods_by_tail[m.modname.rsplit(".", 1)[-1]].append(m.modname)
            self.mod_funcs[m.modname] = m.module_funcs
            for cname, (bases, methods) in m.classes.items():
                self.classes[(m.modname, cname)] = (bases, methods)
                if "__init__" not in methods:
                    self.class_path[(m.modname, cname)] = m.path
                self.class_by_name[cname].append((m.modname, cname))
            for f in m.funcs:
                self.funcs[f.key] = f
        self.children = defaultdict(list)
        self.parents = defaultdict(list)
        for cid, (bases, _) in sorted(self.classes.items()):
            for b in bases:
                for parent in self._find_class(b, cid[0]):
                    self.children[parent].append(cid)
                    self.parents[cid].append(parent)
        self.actor_side = self._actor_side(modules)
        self._family: dict = {}
        self._clock_fields: dict | None = None
        # Collective sites: node -> (line, display, next node or None); a node is a function key, or
        # (key, class) for a method run on an object built as exactly that class (a constructor's chain).
        self.coll: dict = {}
        self._dims_memo: dict = {}
        self.ret_src: dict[str, Src] = {}
        self.attr_src: dict = {}
        candidates = {f.key: f.latch_assigned[0] for f in self.funcs.values() if f.latch_assigned and f.cid}
        candidates = {k: fld for k, fld in candidates.items() if latches.has_finalizer(self, k, fld)}
        self._solve_collectives(frozenset(candidates))
        self.memo = latches.memoized(self, candidates)
        if self.memo != set(candidates):  # a candidate issues a collective outside its latch too
            self._solve_collectives(frozenset(self.memo))
        self._solve_taint(modules)
        self.checked = {k for k, f in self.funcs.items() if f.state_writes}  # pass 2 walks these too
        self._followers: set | None = None
        self._lagging: dict | None = None
        self._owners: dict | None = None
        self._callers_of: dict | None = None
        mod_of = {m.path: m.modname for m in modules}
        self.coll_programs = {program_of(mod_of[self.funcs[_key(k)].path]) for k in self.coll}

    # ---- resolution -------------------------------------------------------
    def _find_modules(self, qual: str) -> list[str]:
        hit = self._found.get(qual)
        if hit is None:
            hit = self._found[qual] = self._find_modules_of(qual)
        return hit

    def _find_modules_of(self, qual: str) -> list[str]:
        if qual in self.mod_funcs:
            return [qual]
        tail = qual.rsplit(".", 1)[-1]
        return [m for m in self.mods_by_tail.get(tail, ()) if m.endswith("." + qual) or qual.endswith("." + m)]

    def _find_class(self, qual: str, from_mod: str) -> list[tuple]:
        key = (qual, from_mod)
        hit = self._found.get(key)
        if hit is None:
            hit = self._found[key] = self._find_class_of(qual, from_mod)
        return hit

    def _find_class_of(self, qual: str, from_mod: str) -> list[tuple]:
        if "." not in qual:
            if (from_mod, qual) in self.classes:
                return [(from_mod, qual)]
            found = self.class_by_name.get(qual, [])
            return found if len(found) <= N.MAX_BY_NAME_CANDIDATES else []
        mod, _, name = qual.rpartition(".")
        found = [(m, name) for m in self._find_modules(mod) if (m, name) in self.classes]
        return found or self._find_class(name, from_mod)

    def _exact_class(self, qual: str, from_mod: str) -> list[tuple]:
        """The class a qualified name denotes, no guessing by bare name (torch.Tensor is not ours)."""
        if "." not in qual:
            return [(from_mod, qual)] if (from_mod, qual) in self.classes else []
        mod, _, name = qual.rpartition(".")
        return [(m, name) for m in self._find_modules(mod) if (m, name) in self.classes]

    def family(self, cid: tuple) -> tuple:
        """CID, its bases and its subclasses: where a field of a CID object can be assigned."""
        hit = self._family.get(cid)
        if hit is None:
            out, stack = {cid}, [cid]
            while stack:  # ancestors
                bases = self.classes.get(stack.pop(), ((), {}))[0]
                for b in bases:
                    for parent in self._find_class(b, cid[0]):
                        if parent not in out:
                            out.add(parent)
                            stack.append(parent)
            stack = [cid]
            while stack:  # descendants
                for child in self.children.get(stack.pop(), ()):
                    if child not in out:
                        out.add(child)
                        stack.append(child)
            hit = self._family[cid] = tuple(sorted(out))
        return hit

    def classes_of(self, specs: frozenset, depth: int = 0) -> list[tuple]:
        """The project classes an object of receiver type SPECS can be an instance of."""
        exact, inexact = self.classes_split(specs, depth)
        return sorted(exact + inexact) if exact else list(inexact)

    def classes_split(self, specs: frozenset, depth: int = 0) -> tuple[tuple, tuple]:
        """(exact, inexact) classes of SPECS: an object built by `Cls(...)`, or held in a field that is only
        ever assigned such objects, is exactly its class; a declared type may be any subclass."""
        key = (specs, depth)
        hit = self._cls_memo.get(key)
        if hit is not None:
            return hit
        self._cls_memo[key] = ((), ())  # cycle guard
        exact: set = set()
        inexact: set = set()
        for sp in specs:
            if sp[0] == "q":
                inexact.update(self._exact_class(sp[2], sp[1]))
            elif sp[0] == "new":
                exact.update(self._exact_class(sp[2], sp[1]))
            elif sp[0] == "self":
                if (sp[1], sp[2]) in self.classes:
                    inexact.add((sp[1], sp[2]))
            elif sp[0] == "attr" and depth < 4:
                declared: set = set()
                for cid in self.classes_of(sp[1], depth + 1):
                    for c in self.family(cid):
                        declared |= self.field_types.get((*c, sp[2]), EMPTY)
                built = frozenset(d for d in declared if d[0] == "new")
                if built and ("open",) not in declared:  # override resolution by the constructed class
                    e, i = self.classes_split(built, depth + 1)
                    exact |= set(e)
                    inexact |= set(i)
                    continue
                e, i = self.classes_split(frozenset(d for d in declared if d[0] != "open"), depth + 1)
                found = set(e) | set(i)
                if not found:  # the class never says: the types declared for this field elsewhere
                    found = set(self.classes_of(frozenset(self.global_field.get(sp[2], ())), depth + 1))
                inexact |= found
        hit = self._cls_memo[key] = (tuple(sorted(exact - inexact)), tuple(sorted(inexact)))
        return hit

    def attr_keys(self, specs: frozenset, name: str) -> list[tuple]:
        key = ("attr_keys", specs, name)
        hit = self._memo.get(key)
        if hit is None:
            # `F.type` (exprs.e_attribute: `obj.F.type`) is its own node only where a class stored a
            # `torch.device(kind, index)` in F; elsewhere it is what F holds.
            whole = name[: -len(N.DEVICE_TYPE_PART)] if name.endswith(N.DEVICE_TYPE_PART) else name
            hit = self._memo[key] = [
                k
                for cid in self.classes_of(specs)
                for c in self.family(cid)
                for k in ((*c, name) if (*c, name) in self._attr_nodes else (*c, whole),)
                if k in self._attr_nodes
            ]
        return hit

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

    def _actor_side(self, modules: list) -> frozenset:
        """Ray actor classes and the classes they are built from (NeMo-RL's `DTensorPolicyWorker`, a
        `@ray.remote` subclass of `DTensorPolicyWorkerImpl`): their methods run in the actor's own process,
        reached through `.remote()`, never by a plain call in the driver."""
        out: set = set()
        stack = [(m.modname, name) for m in modules for name in m.actors if (m.modname, name) in self.classes]
        while stack:
            c = stack.pop()
            if c not in out:
                out.add(c)
                stack.extend(self.parents.get(c, ()))
        return frozenset(out)

    def _overrides(self, cid: tuple, name: str, driver: bool = False) -> list[str]:
        """The overrides of NAME in CID's subclasses; for a DRIVER's call on a declared type, not those of
        the actor side below it (an interface the driver's `Policy` and the actors' workers both implement:
        the driver's `policy.train()` sends work to the actors, which run their own `train()` there)."""
        out, queue, seen = [], deque(self.children.get(cid, ())), set()
        while queue:
            c = queue.popleft()
            if c in seen:
                continue
            seen.add(c)
            if driver and c in self.actor_side:
                continue
            methods = self.classes[c][1]
            if name in methods:
                out.append(methods[name])
            queue.extend(self.children.get(c, ()))
        if driver and len(out) > MAX_OVERRIDES:
            return []  # a base class of dozens of implementations: which one runs is not the code's to show
        return out

    def _in_module(self, name: str, mod: str) -> list[str]:
        key = self.mod_funcs.get(mod, {}).get(name)
        if key:
            return [key]
        if (mod, name) in self.classes:  # a constructor call
            return self._mro((mod, name), "__init__", set())
        return []

    def class_ids(self, ref: tuple) -> list:
        """The project classes REF names (calling one builds an object)."""
        hit = self._memo.get(("class?", ref))
        if hit is None:
            kind, name = ref[0], ref[1]
            hit = []
            if kind == "local" and (ref[2], name) in self.classes:
                hit = [(ref[2], name)]
            elif kind in ("imported", "modfunc"):
                mod, real = (
                    (ref[2].rpartition(".")[0], ref[2].rpartition(".")[2]) if kind == "imported" else (ref[2], name)
                )
                hit = [(m, real) for m in self._find_modules(mod) if (m, real) in self.classes] if mod else []
            self._memo[("class?", ref)] = hit
        return hit

    def is_class(self, ref: tuple) -> bool:
        return bool(self.class_ids(ref))

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
        elif kind == "typed":  # x.m() with x of a known class: its method and reachable overrides
            exact, inexact = self.classes_split(ref[2])
            for cid in inexact:
                out += self._mro(cid, name, set()) + self._overrides(cid, name, driver=True)
            for cid in exact:  # a constructed object: no subclass's override
                out += self._mro(cid, name, set())
        elif kind == "key":  # a closure handed to a thread
            out = [name] if name in self.funcs else []
        out = sorted(set(out))
        self._memo[ref] = out
        return out

    # ---- fixpoints --------------------------------------------------------
    def nodes(self, ref: tuple, ctx: tuple | None = None) -> list:
        """Call-graph nodes a call REF reaches from a function run with `self` exactly of class CTX."""
        key = ("nodes", ref, ctx)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._nodes(ref, ctx)
        return hit

    def _nodes(self, ref: tuple, ctx: tuple | None) -> list:
        kind = ref[0]
        if ctx is not None and kind == "self":
            return [(t, ctx) for t in self._mro(ctx, ref[1], set())]
        if ctx is not None and kind == "super":
            return [(t, ctx) for t in self.resolve(ref)]
        cids = self.class_ids(ref)
        if cids:  # Cls(...): its __init__ runs on exactly a Cls
            return [(t, cid) for cid in cids for t in self._mro(cid, "__init__", set())]
        if kind == "typed":
            exact, inexact = self.classes_split(ref[2])
            out = sorted(
                {
                    t
                    for cid in inexact
                    for t in self._mro(cid, ref[1], set()) + self._overrides(cid, ref[1], driver=True)
                }
            )
            return out + [(t, cid) for cid in exact for t in self._mro(cid, ref[1], set())]
        return self.resolve(ref)

    def _solve_collectives(self, memo: frozenset) -> None:
        """Which nodes transitively issue a collective. Calls of a memoized collective from outside its
        class (MEMO, latches.py) do not count: every rank issues it once per object whatever they do."""
        self.coll = {}
        callers = defaultdict(list)
        queue = deque(sorted(self.funcs))
        seen = set(queue)
        direct = []
        while queue:
            node = queue.popleft()
            key, ctx = (node, None) if isinstance(node, str) else node
            f = self.funcs[key]
            if f.direct:
                direct.append(node)
            for ref, line, display, consts, *_ in f.calls:
                outside = ref[0] not in ("self", "super")
                for t in self.nodes(ref, ctx):
                    tkey = _key(t)
                    if (outside and tkey in memo) or self._mode_skips(tkey, consts):
                        continue
                    callers[t].append((node, line, display))
                    if t not in seen:
                        seen.add(t)
                        queue.append(t)
        self.callers = callers
        direct = [node for node in direct if not self._p2p(node)]
        for node in direct:
            f = self.funcs[_key(node)]
            self.coll[node] = (f.direct[0], f.direct[1], None)
        queue = deque(direct)
        while queue:  # breadth first: each site keeps its shortest chain
            target = queue.popleft()
            for caller, line, display in callers.get(target, ()):
                if caller not in self.coll and not self._p2p(caller):
                    self.coll[caller] = (line, display, target)
                    queue.append(caller)

    def lagging_pools(self) -> dict:
        """The pools (by field name, sources.pool_field) some rank frees at a time of its own, each with the
        evidence (a Lag): a free under an event poll, a deadline or a swallowed failure; in a function such
        a condition calls (LAG_DEPTH calls down); on another thread; or a pool class that changes its own
        fields under such a condition. Only their free counts are findings (sources.LAGGING_KINDS)."""
        if self._lagging is None:
            from hctool.lint.threads import thread_functions

            # function key -> ((path, line) of the per-rank call or thread entry it runs under, the source of
            # that call's condition or None)
            per_rank: dict = {k: ((self.funcs[k].path, self.funcs[k].line), None) for k in thread_functions(self)}
            queue = deque(
                (t, 0, (f.path, line), cause)
                for f in sorted(self.funcs.values(), key=lambda f: f.key)
                for ref, line, cause in f.gated_refs
                for t in self.resolve(ref)
            )
            while queue:  # what such a condition calls, and what that calls, LAG_DEPTH calls down
                key, depth, via, cause = queue.popleft()
                if key in per_rank or key not in self.funcs:
                    continue
                per_rank[key] = (via, cause)
                if depth < LAG_DEPTH:
                    calls = self.funcs[key].calls
                    queue.extend((t, depth + 1, via, cause) for ref, *_rest in calls for t in self.resolve(ref))
            pools: dict = {}
            for f in sorted(self.funcs.values(), key=lambda f: f.key):
                for pool, gated, line in f.frees:
                    if pool != S.SELF_LAGS and pool not in pools and (gated or f.key in per_rank):
                        pools[pool] = Lag(f.path, line, None, None) if gated else Lag(f.path, line, *per_rank[f.key])
            # A pool class that frees on its own at a time of its own (`_collect()` returns the pages whose
            # copy event fired): every field declared or built as that class, a base or a subclass of it.
            lagging = {}
            for f in sorted(self.funcs.values(), key=lambda f: f.key):
                for p, _g, line in f.frees:
                    if f.cid and p == S.SELF_LAGS and f.cid not in lagging:
                        lagging[f.cid] = Lag(f.path, line, None)
            if lagging:
                for fname, specs in sorted(self.global_field.items()):
                    if fname in pools:
                        continue
                    for cid in self.classes_of(frozenset(specs)):
                        hit = sorted(set(self.family(cid)) & set(lagging))
                        if hit:
                            pools[fname] = lagging[hit[0]]
                            break
            self._lagging = pools
        return self._lagging

    def _p2p(self, node) -> bool:
        """A pipeline point-to-point exchange (names.P2P_EXCHANGE): no collective for its callers."""
        return bool(N.P2P_EXCHANGE.search(self.funcs[_key(node)].qual.rsplit(".", 1)[-1]))

    # ---- facts for pass 2 -------------------------------------------------
    def chain(self, key) -> tuple:
        """Hops from node KEY down to the collective it issues: (path, line, message)."""
        hops, seen = [], set()
        while key is not None and key not in seen:
            seen.add(key)
            line, display, nxt = self.coll[key]
            f = self.funcs[_key(key)]
            what = f"calls `{display}()`" if nxt else f"issues `{display}()`"
            hops.append((f.path, line, f"`{f.qual}` {what}"))
            key = nxt
        return tuple(hops)

    def group_dims(self, ref: tuple | None, consts: frozenset = frozenset()) -> frozenset:
        """The parallel dimensions of the groups the collectives a call of REF issues run on, its callees'
        included (`gather_pipeline_parallel_state_dict()` gathers on the pipeline group, whoever calls it):
        names.WORLD for one on the world, a group's own text (names.group_token) for one on a group that
        names no dimension, `group:?` for one not followed (recursion)."""
        if ref is None:
            return frozenset()
        outside = ref[0] not in ("self", "super")
        dims: frozenset = frozenset()
        for t in self.nodes(ref):
            if t not in self.coll or self._mode_skips(_key(t), consts) or (outside and _key(t) in self.memo):
                continue
            dims = dims | self._dims(t, set())
        return dims

    def _dims(self, node, seen: set) -> frozenset:
        """NODE's collectives' group dimensions, its callees' included (group_dims)."""
        hit = self._dims_memo.get(node)
        if hit is not None:
            return hit
        if node in seen:  # recursion: not followed
            return N.group_token("?")
        seen.add(node)
        key, ctx = (node, None) if isinstance(node, str) else node
        f = self.funcs[key]
        dims = (f.direct_dims or N.group_token("?")) if f.direct else frozenset()
        for ref, _line, _display, consts, *_ in f.calls:
            for t in self.nodes(ref, ctx):
                if t in self.coll and not self._mode_skips(_key(t), consts):
                    dims = dims | self._dims(t, seen)
        self._dims_memo[node] = dims
        return dims

    def retried_alone(self, key: str) -> bool:
        """No function that calls KEY issues a collective other than through KEY (retries.py): a caller
        that does would interleave its own collectives with KEY's at a time that differs per rank."""
        for node, calls in self.callers.items():
            if _key(node) != key:
                continue
            for caller, _line, _display in calls:
                ckey, ctx = (caller, None) if isinstance(caller, str) else caller
                f = self.funcs[ckey]
                if f.direct:
                    return False
                for ref, _l, _d, consts, *_ in f.calls:
                    for t in self.nodes(ref, ctx):
                        if _key(t) != key and t in self.coll and not self._mode_skips(_key(t), consts):
                            return False
        return True

    def _mode_skips(self, target: str, consts: frozenset) -> bool:
        """A call such as writing_check(write_back=True) selects a mode that returns first."""
        mode = self.funcs[target].mode_exit if target in self.funcs else None
        return bool(mode) and (("kw", mode[0]) in consts or ("pos", mode[1]) in consts)

    def call(self, ref: tuple, args: frozenset, consts: frozenset = frozenset()) -> tuple[tuple, frozenset]:
        targets = self.resolve(ref)
        outside = ref[0] not in ("self", "super")
        sites = [
            t
            for t in self.nodes(ref)
            if t in self.coll and not self._mode_skips(_key(t), consts) and not (outside and _key(t) in self.memo)
        ]
        # A constructor returns the object, whatever its __init__ returns early on.
        t = frozenset(self.ret_src[k] for k in targets if k in self.ret_src and not k.endswith(".__init__"))
        if not sites and not self.is_class(ref):
            t = t | args
        return (self.chain(sites[0]) if sites else ()), t

    def attr(self, specs: frozenset, name: str) -> frozenset:
        srcs = {self.attr_src[k] for k in self.attr_keys(specs, name) if k in self.attr_src}
        return frozenset((min(srcs),)) if srcs else EMPTY

    def loose(self, name: str) -> frozenset:
        """Field NAME of an object whose type is unknown: rank-local where a thread writes such a field,
        unless two classes of the project have a field of that name (issue 34, class 4: a thread's
        `transfer.host_indices` is not the `operation.host_indices` a condition reads; with the types
        unknown, a name two classes share says nothing about which one the thread wrote)."""
        src = self.loose_src.get(name)
        if not src or self._field_owners().get(name.split("@", 1)[0], 0) > 1:
            return EMPTY
        return frozenset((src,))

    def _field_owners(self) -> dict:
        """Field name -> how many classes assign (`self.F = ...`) or declare (a dataclass field) it."""
        if self._owners is None:
            owners = defaultdict(set)
            for f in self.funcs.values():
                if f.cid:
                    for specs, fname, _line in f.writes:
                        if specs is None:
                            owners[fname].add(f.cid)
            for m in self.modules.values():
                for cname, fname in (*m.attr_assigns, *m.field_types):
                    owners[fname].add((m.modname, cname))
            self._owners = {k: len(v) for k, v in owners.items()}
        return self._owners

    def held_group(self, specs: frozenset, name: str) -> frozenset | None:
        """The rank-id comparisons (their text) true on every rank that holds field NAME of an object of type
        SPECS: every assignment of it in the class family (but `= None`) runs under rank-id tests, in its
        function or at every call of that function (two calls up), and these comparisons hold at all of them
        (issue 34: OpenRLHF's `_model_update_group`, made in `_init_vllm_sync_group`, which is called only
        where `torch.distributed.get_rank() == 0`: a group of rank 0 and the vLLM ranks). None where some
        assignment runs on every rank, or where anything but the class's own methods assigns it."""
        keys = []
        for cid in self.classes_of(specs):
            for c in self.family(cid):
                for f in self._funcs_of_class().get(c, ()):
                    for fname, tests in f.id_writes:
                        if fname != name:
                            continue
                        up = self._called_under(f.key, 0)
                        if tests is None and up is None:
                            return None
                        keys.append((tests or frozenset()) | (up or frozenset()))
        if not keys or self._written_outside(name):
            return None
        return frozenset.intersection(*keys) or None

    def _funcs_of_class(self) -> dict:
        hit = self._memo.get("funcs_of_class")
        if hit is None:
            hit = self._memo["funcs_of_class"] = defaultdict(list)
            for f in self.funcs.values():
                if f.cid:
                    hit[f.cid].append(f)
        return hit

    def _written_outside(self, name: str) -> bool:
        """Whether field NAME is assigned on an object other than `self` somewhere (`engine.group = g`)."""
        hit = self._memo.get(("written_outside", name))
        if hit is None:
            hit = self._memo[("written_outside", name)] = any(
                specs is not None and fname.split("@", 1)[0] == name
                for f in self.funcs.values()
                for specs, fname, _line in f.writes
            )
        return hit

    def _called_under(self, key: str, depth: int) -> frozenset | None:
        """The rank-id comparisons true at every call of function KEY (through its callers' own, two calls
        up); None where a call runs on every rank, or KEY has no call the project resolves."""
        if self._callers_of is None:
            rev = defaultdict(list)
            for f in self.funcs.values():
                for ref, line, *_ in f.calls:
                    for t in self.resolve(ref):
                        rev[t].append((f.key, ref, line))
            self._callers_of = rev
        sites = self._callers_of.get(key)
        if not sites or depth > 1:
            return None
        out = None
        for caller, ref, line in sites:
            f = self.funcs[caller]
            tests = next((k for r, ln, k in f.id_calls if ln == line and r == ref), None)
            up = self._called_under(caller, depth + 1) if caller != key else None
            if tests is None and up is None:
                return None
            here = (tests or frozenset()) | (up or frozenset())
            out = here if out is None else out & here
        return out

    def clock_field(self, name: str) -> frozenset:
        """Any class's field NAME holding a wall-clock value (sort keys rarely name their type)."""
        if self._clock_fields is None:
            self._clock_fields = {}
            for k, src in sorted(self.attr_src.items()):
                if src.kind == "clock":
                    self._clock_fields.setdefault(k[2], src)
        src = self._clock_fields.get(name)
        return frozenset((src,)) if src else EMPTY

    def _follower_keys(self) -> set:
        """Functions a process runs on command: called, within two calls, by a function that receives
        messages from another process (a worker's `handle(sock.recv_pyobj())` loop). The collectives
        they reach are entered once per command received, whatever the receiving process observes."""
        if self._followers is None:
            out: set = set()
            frontier = sorted(k for k, f in self.funcs.items() if f.receives)
            for _ in range(2):
                nxt = []
                for k in frontier:
                    for ref, *_ in self.funcs[k].calls:
                        for t in self.resolve(ref):
                            if t not in out:
                                out.add(t)
                                nxt.append(t)
                frontier = nxt
            self._followers = out
        return self._followers

    def follows(self, ref: tuple) -> bool:
        """Whether processes that receive commands run the function REF calls."""
        return any(t in self._follower_keys() for t in self.resolve(ref))

    def paired_ops(self, key: str) -> frozenset:
        """For `__enter__` (or `__exit__`) KEY, the collective family the class's other half issues, if it
        issues one (a context manager that lets rank 0 go first: the others wait in `__enter__`, rank 0
        in `__exit__`; checks.check_function)."""
        f = self.funcs.get(key)
        half = key.rsplit(".", 1)[-1]
        if f is None or f.cid is None or half not in ("__enter__", "__exit__"):
            return frozenset()
        other = "__exit__" if half == "__enter__" else "__enter__"
        other_key = self.classes.get(f.cid, ((), {}))[1].get(other)
        if other_key is None or other_key not in self.coll:
            return frozenset()
        node, seen = other_key, set()
        while node not in seen:  # down the call chain to the collective itself (its display, not a message)
            seen.add(node)
            _line, display, nxt = self.coll[node]
            if nxt is None:
                return frozenset({N.op_family(display)})
            node = nxt
        return frozenset()

    def component_has_collectives(self, key: str) -> bool:
        """Whether the class of method KEY (or, for a function, its module) issues a collective anywhere:
        only such a component holds items every rank holds (checks: HC104's state writes)."""
        f = self.funcs.get(key)
        if f is None:
            return False
        if f.cid is not None:
            return any(k in self.coll for k in self.classes.get(f.cid, ((), {}))[1].values())
        return any(g.path == f.path and g.key in self.coll for g in self.funcs.values())

    def leads(self, key: str) -> bool:
        """Whether function KEY decides on its own: it neither receives commands nor runs on one."""
        f = self.funcs.get(key)
        return f is not None and not f.receives and key not in self._follower_keys()

    def program_has_collectives(self, modname: str) -> bool:
        """Whether the program MODNAME belongs to issues collectives (see program_of)."""
        return program_of(modname) in self.coll_programs

    def module_has_collectives(self, m: ModuleSummary) -> bool:
        """Whether pass 2 has anything to look at in M."""
        return any(f.key in self.coll or f.key in self.checked for f in m.funcs)


def _key(node) -> str:
    """The function key of a call-graph node (a key, or (key, exact class))."""
    return node if isinstance(node, str) else node[0]

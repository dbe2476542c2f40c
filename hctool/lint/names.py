"""Default name tables and the per-module import map used to classify calls.

Matching is by name, not by type: a call is a collective when its qualified
name (imports expanded) is a torch.distributed collective, or its final name
is unambiguous (`all_reduce`), or a configured wrapper. Point-to-point ops are
left out on purpose: `if rank == 0: send() else: recv()` is correct SPMD code.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache

# Names that mean a collective whatever the receiver (dist.*, a ProcessGroup, a wrapper).
COLLECTIVE_NAMES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_coalesced",
        "_all_gather_base",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "all_to_all",
        "all_to_all_single",
        "broadcast_object_list",
        "gather_object",
        "scatter_object_list",
        "barrier",
        "monitored_barrier",
        "new_group",
        "new_subgroups",
        "new_subgroups_by_enumeration",
        "allreduce",
        "allreduce_coalesced",
        "allgather",
        "allgather_coalesced",
        "alltoall",
        "alltoall_base",
    }
)
# Too common elsewhere (functools.reduce, Tensor.gather, numpy.broadcast): only via
# torch.distributed or a receiver that looks like a process group.
AMBIGUOUS_COLLECTIVES = frozenset({"broadcast", "reduce", "gather", "scatter"})

# (get_global_rank(group, r) and get_group_rank(group, r) translate a rank they are given: their result
# is as rank-local as R, which is uniform when every rank passes the same one.)
RANK_CALLS = frozenset(
    {
        "get_rank",
        "get_local_rank",
        "get_node_local_rank",
        "get_tensor_model_parallel_rank",
        "get_attention_tp_rank",
    }
)
# Method names whose result is a rank-local observation (pool free counts, event polls, thread queues).
RANK_LOCAL_METHODS = frozenset({"available_size", "query", "is_completed", "qsize"})
RANK_ENV_VARS = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK"})
LOCAL_RANK = re.compile(r"(?i)local_?rank")  # a name holding a process's rank on its node (paths._values)
# Rank ids within the groups collectives usually run on (tensor parallel). Pipeline and data-parallel
# coordinates (pp_rank, dp_rank) are constant inside a TP/CP group, so they are not listed.
RANK_VARIABLES = frozenset({"rank", "local_rank", "global_rank", "tp_rank", "attn_tp_rank", "tp_local_rank"})
# Calls that create a process group by a rendezvous of the ranks that pass their own rank and the group's
# size (`init_process_group`, ray's `init_collective_group`, vLLM-style `stateless_init_process_group`):
# only the members call them. A rank that leaves before such a call is no member of the group it makes,
# so the collectives on that group after it are not skipped by anyone in it (torch's `new_group` is not
# one: every rank of the world must call it).
GROUP_RENDEZVOUS = re.compile(r"^_*(\w*_)?init_\w*(process_group|collective_group|group)$")
# The suffix of a field's name under which the project keeps what the field holds apart from the index of a
# `torch.device(type, index)` stored in it (exprs._device_parts): what `obj.F.type` reads. DEVICE_INDEX_PART: the
# index's part, folded back into F itself (taint.py), so every other read of F, `.index` too, still has it.
DEVICE_TYPE_PART = ".type"
DEVICE_INDEX_PART = ".index"
# Pipeline point-to-point exchanges (`send_forward`, `recv_backward`, `send_forward_recv_backward`): a stage
# pairs each with its neighbour's opposite call, however the library implements it (a broadcast on a
# two-rank group, in ColossalAI's p2p_v2). Their counts differ per stage on purpose (1F1B warm-up), so a
# call of one is no collective of its caller: whether the pairs match is the schedule's, not a rank id's.
P2P_EXCHANGE = re.compile(r"^_*(i?send|i?recv)_(forward|backward)")


CLOCK_CALLS = frozenset(
    {
        "time.time",
        "time.monotonic",
        "time.perf_counter",
        "time.time_ns",
        "time.monotonic_ns",
        "time.perf_counter_ns",
        "time.process_time",
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.now",
        "datetime.utcnow",
    }
)
# Progress bars that yield the items of the iterable they wrap (DiT's `tqdm(pbar) if rank == 0 else pbar`).
PROGRESS_WRAPPERS = frozenset({"tqdm", "track", "alive_it"})
# Builtins whose result is just the value of their arguments (a rank id stays a rank id).
VALUE_BUILTINS = frozenset(
    {
        "int",
        "float",
        "str",
        "bool",
        "len",
        "range",
        "min",
        "max",
        "abs",
        "divmod",
        "sum",
        "sorted",
        "list",
        "tuple",
        "set",
        "dict",
        "enumerate",
        "zip",
        "reversed",
        "round",
        "any",
        "all",
        "format",
        "repr",
        "hash",
    }
)
# Builtins that read values or types: no I/O of theirs fails on one rank (exprs._may_fail; issue 34:
# FastVideo's `isinstance(pg, ProcessGroup)` inside `suppress(OSError)`).
PURE_BUILTINS = VALUE_BUILTINS | frozenset({"isinstance", "issubclass", "hasattr", "callable", "id", "type"})
# Replicated by construction in SGLang-shaped schedulers: request slots are taken and returned at
# the same points of the replicated schedule on every rank (unlike KV pages, whose free count
# moves with per-rank load-back and write-back). A `rank-local` config entry overrides this.
DEFAULT_UNIFORM = frozenset({"req_to_token_pool.available_size"})
UNIFORM_CALLS = frozenset({"get_world_size", "is_initialized", "is_available", "get_backend", "broadcast_pyobj"})

# A method of a training framework's strategy or accelerator that returns what the ranks agreed
# (`skip = trainer.strategy.broadcast(skip)`, `strategy.reduce_boolean_decision(flag)`: Lightning's
# ModelCheckpoint broadcasts its wall-clock decision from rank 0). Its result is the same on every rank,
# whatever went in. Not on numeric libraries, where the names mean shapes and indexing.
AGREED_METHODS = frozenset({"broadcast", "broadcast_object", "reduce_boolean_decision", "all_reduce", "all_gather"})
NUMERIC_MODULES = ("numpy.", "jax.", "torch.", "tensorflow.", "functools.")

# Method names too generic to resolve by name alone on an unknown receiver
# (dicts, lists, tensors, futures): resolving them would link unrelated classes.
GENERIC_METHODS = frozenset(
    {
        "get",
        "set",
        "pop",
        "append",
        "extend",
        "insert",
        "remove",
        "clear",
        "update",
        "copy",
        "items",
        "keys",
        "values",
        "add",
        "discard",
        "put",
        "join",
        "split",
        "format",
        "strip",
        "item",
        "tolist",
        "numpy",
        "to",
        "cpu",
        "cuda",
        "view",
        "reshape",
        "sum",
        "mean",
        "max",
        "min",
        "sort",
        "index",
        "count",
        "wait",
        "result",
        "done",
        "close",
        "start",
        "stop",
        "run",
        "read",
        "write",
        "send",
        "recv",
        "flush",
        "encode",
        "decode",
        "replace",
        "fill_",
        "copy_",
        "zero_",
        "record",
        "synchronize",
        "__init__",
        "__call__",
        "forward",
        "apply",
        "step",
        "reset",
        "init",
        "setup",
        "info",
        "debug",
        "warning",
        "error",
        "exception",
        "log",
        "sleep",
        "free",
        "alloc",
        "release",
        "acquire",
        "lock",
    }
)
# How far rank-local state travels between functions: through fields freely (a budget stored in
# PrefillAdder.rem_total_tokens) but out of one function result at most (add_one_req()'s verdict).
# Further on it has become scheduling decisions (batches, queues) that are replicated in the group.
MAX_HOPS = 1
MAX_THREAD_HOPS = 2  # a field a thread writes: through at most two more results or fields, never a constructor
MAX_BY_NAME_CANDIDATES = 6  # base classes named without a module: more same-named classes, no guess

# Messages between processes (sockets, pipes; zmq's send_pyobj, SGLang-style sock_send wrappers): a
# leader that sends a command its followers act on (walker: sends, project: followers). torch.distributed's
# send/recv are point-to-point tensors, not commands.
MESSAGE_SEND = re.compile(r"^_*(async_)?(sock_)?send(_pyobj|_json|_string|_multipart|_bytes|_message)?$")
MESSAGE_RECV = re.compile(r"^_*(async_)?(sock_)?recv(_pyobj|_json|_string|_multipart|_bytes|_message)?$")


def is_message(pattern, last: str, qual: str | None) -> bool:
    key = (pattern, last)
    hit = _MESSAGE_NAMES.get(key)
    if hit is None:
        hit = _MESSAGE_NAMES[key] = bool(pattern.match(last))
    return hit and not (qual or "").startswith("torch.")


_MESSAGE_NAMES: dict = {}  # (pattern, name) -> whether it matches: a call name recurs thousands of times


ORDERING_CALLS = frozenset({"sorted", "min", "max", "sort", "nsmallest", "nlargest"})
HEAP_PUSH = frozenset({"heappush", "heappushpop", "heapreplace"})


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    kind = type(node)
    if kind is ast.Name:  # the common shapes first: a name, and a field of one (`self.rank`)
        return node.id
    if kind is ast.Attribute and type(node.value) is ast.Name:
        return node.value.id + "." + node.attr
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def import_map(tree: ast.Module, modname: str) -> dict[str, str]:
    """Local name -> qualified dotted name, from the module's top-level and nested imports."""
    out: dict[str, str] = {}
    package = modname.rsplit(".", 1)[0] if "." in modname else ""
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    out[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(p for p in (*parts, base) if p)
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
    for node in tree.body:  # module-level aliases of imported names: `clock = time`
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, (ast.Name, ast.Attribute))
        ):
            value = dotted(node.value)
            if value and value.split(".")[0] in out:
                out.setdefault(node.targets[0].id, qualify(value, out))
    return out


def _statements(body: list):
    """Every statement, nested ones included, without descending into expressions (fast)."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        parts = _BODIES.get(type(node))
        if parts is None:
            parts = _BODIES[type(node)] = tuple(p for p in _BODY_FIELDS if p in node._fields)
        for part in parts:
            sub = getattr(node, part, None)
            if sub:
                stack.extend(reversed(sub))


_BODY_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_BODIES: dict = {}  # node type -> the statement-list fields it has, of _BODY_FIELDS (most have none)


def qualify(name: str | None, imports: dict[str, str]) -> str | None:
    if name is None:
        return None
    head, _, rest = name.partition(".")
    if head in imports:
        return imports[head] + ("." + rest if rest else "")
    return name


def looks_like_group(receiver: str | None) -> bool:
    if not receiver:
        return False
    last = receiver.rsplit(".", 1)[-1].lower()
    return "group" in last or last in ("pg", "_pg", "default_pg", "dist", "c10d")


_OP_FAMILIES = (
    ("all_reduce", "all_reduce"),
    ("allreduce", "all_reduce"),
    ("all_gather", "all_gather"),
    ("allgather", "all_gather"),
    ("reduce_scatter", "reduce_scatter"),
    ("all_to_all", "all_to_all"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("reduce", "reduce"),
)


@lru_cache(maxsize=1 << 14)
def op_family(name: str) -> str:
    """`tensor_model_parallel_all_reduce`, `_all_reduce`, `dist.all_reduce` -> "all_reduce"."""
    last = name.rsplit(".", 1)[-1].lower()
    return next((fam for key, fam in _OP_FAMILIES if key in last), last)


_SIZE_RE = re.compile(
    r"(^|_)(world|tp|pp|dp|cp|ep|group|sync|attn_tp|attn_dp|attn_cp|moe_tp|moe_ep)_size$|^world_size$"
)


@lru_cache(maxsize=1 << 14)
def is_group_size(name: str) -> bool:
    """Group and parallel sizes are the same on every rank of a group (set by the launcher)."""
    return bool(_SIZE_RE.search(name))


# The group of every rank (`dist.all_reduce(x)` without a group, `get_world_group()`, `group.WORLD`): it
# holds ranks of every coordinate, so any rank id can set its members apart (checks._other_dimension).
WORLD = "world"

# Where torch.distributed's functions take their group positionally (`broadcast(t, src, group)`): a
# call with an argument there runs on that group, not on the world.
GROUP_POSITION = {
    "all_reduce": 2,
    "all_reduce_coalesced": 2,
    "broadcast": 2,
    "broadcast_object_list": 2,
    "all_gather": 2,
    "all_gather_into_tensor": 2,
    "all_gather_object": 2,
    "all_gather_coalesced": 2,
    "_all_gather_base": 2,
    "reduce": 3,
    "gather": 3,
    "gather_object": 3,
    "scatter": 3,
    "scatter_object_list": 3,
    "reduce_scatter": 3,
    "reduce_scatter_tensor": 3,
    "_reduce_scatter_base": 3,
    "all_to_all": 2,
    "all_to_all_single": 4,
    "barrier": 0,
    "monitored_barrier": 0,
}

# Parallel dimensions named in a rank id or a group expression. Ranks of one group share their
# coordinate in every other dimension (the data-parallel group of a tensor-parallel rank 0 holds only
# tensor-parallel ranks 0), so a rank id of one dimension is uniform inside a group of another.
_DIM_WORDS = {
    "tp": "tp",
    "tensor": "tp",
    "mp": "tp",
    "pp": "pp",
    "pipeline": "pp",
    "stage": "pp",
    "dp": "dp",
    "data": "dp",
    "cp": "cp",
    "context": "cp",
    "ep": "ep",
    "expert": "ep",
    "moe": "ep",
    "sp": "sp",
    "sequence": "sp",
    "row": "row",
    "col": "col",
    "column": "col",
    "depth": "depth",
    "dep": "depth",
    "input": "3d-input",
    "weight": "3d-weight",
    "output": "3d-output",
    "fsdp": "dp",
    "shard": "shard",
    "replicate": "dp",
    "embd": "embd",
    "embedding": "embd",
    "position": "pos",
    "world": WORLD,
}
_WORD = re.compile(r"[A-Za-z][a-z]*|[0-9]+d", re.ASCII)


def group_token(text: str) -> frozenset:
    """A group that names no parallel dimension (`group=self.group`, `group=g`), as a dimension of its own:
    `get_rank(group=g)` and `barrier(group=g)` share it; nothing else does (checks._other_dimension)."""
    return frozenset((GROUP_PREFIX + text,))


GROUP_PREFIX = "group:"


def scoped(dims_: frozenset) -> bool:
    """Whether a collective's group is known to hold ranks of every coordinate the test can read: the world,
    or a group of a named parallel dimension (not only a group's own text)."""
    return any(not d.startswith(GROUP_PREFIX) for d in dims_)


def dims(text: str) -> frozenset:
    """The parallel dimensions TEXT names (`get_tensor_model_parallel_rank` -> tp, `ParallelMode.PARALLEL_2D_COL`
    -> col, `self.data_parallel_group` -> dp); empty for the world or anything unnamed."""
    # The last name of a dotted path says what it is; the objects it is reached through do not
    # (`self.parallel_context.pp_pg` is a pipeline group, not a context-parallel one: lighteval's
    # nanotron model). A last name that names none leaves the whole (`device_mesh["tp"].get_group()`).
    tail = text.rsplit(".", 1)[-1]
    return (_dims(tail) if tail != text else frozenset()) or _dims(text)


def _dims(text: str) -> frozenset:
    words = [w.lower() for part in re.split(r"[^A-Za-z0-9]+", text) for w in (part.split("_") if part else ())]
    three_d = "3d" in words
    # 3D parallelism's input/weight/output dimensions only where the text says 3D (`PARALLEL_3D_WEIGHT`):
    # `weight_update_groups` is a weight-sync group, not a dimension (issue 34: AReaL)
    return frozenset(
        _DIM_WORDS[w] for w in words if w in _DIM_WORDS and (three_d or not _DIM_WORDS[w].startswith("3d-"))
    )

"""Rank-local sources: their kinds, severities and premises, and the call shapes that make them.

A source kind says why a value can differ between the ranks of one group:
  id, id-local  a rank id compared (who logs, who is root; role arms that pair     high
                are not findings, see shapes._role_branch)
  pool          a pool's free count (`available_size()`, `free_count()`,          medium
                `get_num_free_blocks()`: a method without arguments whose name says "free" or
                "available" and a quantity): differs only where allocations or frees complete
                per rank, a premise the user can accept away
  poll          an event or future poll (`query()`, `done()`, `is_set()`)          high
  deadline      a per-rank deadline (`perf_counter() > deadline`)                  high
  thread        a field assigned on another thread (its timing is per rank)        high
  io            the failure of an I/O call a handler swallows (storage attach)     high
  rank          a configured `rank-local` name, a thread queue's `qsize()`         high
Two kinds never decide control flow on their own: `clock` (a stamp, which only a deadline
comparison turns into a decision) and `order` (a list ordered by stamps, see HC104).
"""

from __future__ import annotations

import ast
import re

from hctool.lint import names as N

NOT_CONTROL = frozenset({"clock", "order"})
SEVERITY = {"pool": "medium"}  # every other kind: high, a rank id too (it differs on every rank by definition)
LEVELS = ("low", "medium", "high")

# Method names whose result is a rank-local observation, by kind.
METHODS = {
    "available_size": "pool",
    "query": "poll",
    "is_completed": "poll",
    "done": "poll",
    "is_set": "poll",
    "qsize": "rank",
}
SELF_METHODS_EXCLUDED = frozenset({"done", "is_set"})  # `self.done()` is a project method, not a poll
# An I/O call whose failure a handler swallows leaves this rank in another state than its peers.
IO_CALL = re.compile(
    r"^_*(attach|connect|open|mount|download|upload|fetch|read|register_storage)|^urlopen$|"
    r"^batch_(get|set|exists)"
)
BROAD_EXCEPTIONS = frozenset(
    {
        "Exception",
        "BaseException",
        "OSError",
        "IOError",
        "ConnectionError",
        "RuntimeError",
        "TimeoutError",
        "EnvironmentError",
    }
)

# Premises: id -> (what must hold for the source to differ between ranks). `uniform = ["<id>"]` accepts it away.
PREMISES = {
    "kv-free-count": "the KV free count differs between ranks when frees lag (device pages freed as copies "
    "complete on each rank)",
    "host-free-count": "the host pool's free count differs between ranks (write-backs and prefetches "
    "finish on each rank at its own time)",
    "pool-free-count": "this pool's free count differs between ranks (allocations or frees that complete per rank)",
}


def severity(kind: str | None) -> str:
    return "low" if kind is None else SEVERITY.get(kind, "high")


def premise_id(kind: str, what: str) -> str | None:
    if kind != "pool":
        return None
    low = what.lower()
    if "host" in low:
        return "host-free-count"
    if "kv" in low or "token" in low:
        return "kv-free-count"
    return "pool-free-count"


# A pool's or an allocator's free count, by the words of its name: one that says "free" (or "available",
# "unused", "idle") and one that says how many. Not an exhaustive list of any one engine's pools: SGLang's
# `available_size()`, a `free_count()`, vLLM-style `get_num_free_blocks()` all read as "how many are free".
_FREE_WORDS = frozenset({"free", "available", "avail", "unused", "idle"})
_QUANTITY_WORDS = frozenset({"count", "size", "num", "number", "len", "length", "capacity", "amount"})


def is_free_count(name: str, call: ast.Call | None) -> bool:
    """`pool.free_count()`: a question about a pool, so it takes no argument (`free_blocks(blocks)` with
    one is the verb that frees them)."""
    if call is not None and (call.args or call.keywords):
        return False
    words = set(name.lower().strip("_").split("_"))
    return bool(words & _FREE_WORDS) and bool(words & _QUANTITY_WORDS)


# What makes a pool's free count differ between ranks is a change of the pool that one rank makes at a
# time of its own: a free or a release under an event poll, a per-rank deadline, a failure a handler
# swallowed, or on another thread (project.Project.lagging_pools). Without one, the count moves only at
# points of the replicated schedule and is the same on every rank of the group: no finding.
LAGGING_KINDS = frozenset({"poll", "deadline", "io", "swallow", "rank"})
_POOL_CHANGE = re.compile(r"^_*(free|release|dealloc|deallocate|evict|return)(_|$)")


SELF_LAGS = "@self"  # a method that changes its own object's fields under such a condition (`_collect()`)


def is_pool_change(name: str) -> bool:
    """`pool.free(idx)`, `allocator.release_pages(...)`, `evict(n)`: a call that gives pages back."""
    hit = _POOL_CHANGES.get(name)
    if hit is None:
        hit = _POOL_CHANGES[name] = bool(_POOL_CHANGE.search(name))
    return hit


_POOL_CHANGES: dict = {}  # name -> is_pool_change(name)


def pool_field(receiver: str | None) -> str | None:
    """The name a pool is known by across the code: the last field or variable of its receiver
    (`self.tree_cache.token_to_kv_pool_allocator` -> `token_to_kv_pool_allocator`)."""
    if not receiver:
        return None
    last = receiver.rsplit(".", 1)[-1]
    return None if last in ("self", "cls") else last


def free_count_pool(what: str) -> str | None:
    """The pool a free-count source reads (`self.pool.free_count()` -> `pool`), from the source's text."""
    text = what.strip("`")
    if not text.endswith("()") or "." not in text:
        return None
    return pool_field(text[:-2].rsplit(".", 1)[0])


def method_kind(func: ast.Attribute, imports: dict, call: ast.Call | None = None) -> str | None:
    """The kind of `x.NAME()` when NAME is a rank-local observation on this receiver."""
    kind = METHODS.get(func.attr)
    if kind is None and is_free_count(func.attr, call):
        kind = "pool"
    if kind is None:
        return None
    base = N.dotted(func.value)
    if base is not None and base.split(".", 1)[0] in imports:  # a module function (`torch.cuda.query`)
        return None
    if func.attr in SELF_METHODS_EXCLUDED and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls"):
        return None
    return kind


def is_deadline_compare(node: ast.Compare, operand_kinds: list) -> bool:
    """`now > deadline`, `time.time() - t0 >= timeout`, `0 < entry_time < deadline`: an ordering test
    with a clock on one side of a pair whose other side is not a constant 0 or None."""
    items = [node.left, *node.comparators]
    for i, op in enumerate(node.ops):
        if not isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
            continue
        a, b = items[i], items[i + 1]
        ka, kb = operand_kinds[i], operand_kinds[i + 1]
        if not (ka or kb):
            continue
        other = b if ka else a
        if isinstance(other, ast.Constant) and other.value in (0, None) and not (ka and kb):
            continue
        return True
    return False


def is_none_test(node: ast.Compare) -> bool:
    """`x is None` / `x is not None`: whether a value is set, not which value (launch mode)."""
    return all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and all(
        isinstance(c, ast.Constant) and c.value is None for c in node.comparators
    )


def is_membership(node: ast.Compare) -> bool:
    """`x in xs` / `x not in xs`."""
    return all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)


def io_call(body: list) -> tuple[str, int] | None:
    """The first call in a try body that does I/O by its name (attach, connect, open, read ...)."""
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call):
                name = (N.dotted(n.func) or "").rsplit(".", 1)[-1]
                if name and IO_CALL.search(name):
                    return name, n.lineno
    return None


# Exceptions that only I/O raises: a handler or `suppress()` of these alone says any call in its body
# is expected to fail on some rank (a shared-memory create, a socket), not only calls named like I/O.
OS_ERRORS = frozenset(
    {
        "OSError",
        "IOError",
        "EnvironmentError",
        "FileNotFoundError",
        "FileExistsError",
        "PermissionError",
        "ConnectionError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "BrokenPipeError",
        "TimeoutError",
        "BlockingIOError",
        "InterruptedError",
    }
)


def exception_names(node) -> list[str]:
    types = node.elts if isinstance(node, ast.Tuple) else [node]
    return [(N.dotted(t) or "?").rsplit(".", 1)[-1] for t in types]


def swallow_scope(types: list[str]) -> str | None:
    """What a construct that swallows TYPES lets fail: "any" call (I/O errors only), "io" (calls named
    like I/O, under a broad Exception), or None (it swallows nothing a rank meets on its own)."""
    if types and all(t in OS_ERRORS for t in types):
        return "any"
    if any(t in BROAD_EXCEPTIONS for t in types):
        return "io"
    return None


def suppress_types(node: ast.expr, imports: dict) -> list[str] | None:
    """The exception names of `contextlib.suppress(A, B)` (None if NODE is no such call)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    if N.qualify(N.dotted(node.func), imports) != "contextlib.suppress":
        return None
    return [n for a in node.args for n in exception_names(a)]


def swallows(handler: ast.ExceptHandler) -> bool:
    """A handler that catches broad failures and carries on (no raise): the rank goes on in another state."""
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    if handler.type is not None and not any((N.dotted(t) or "").rsplit(".", 1)[-1] in BROAD_EXCEPTIONS for t in types):
        return False
    return not any(isinstance(n, ast.Raise) for s in handler.body for n in ast.walk(s))


# Where a function is handed to another thread: Thread(target=f), Timer(t, f), pool.submit(f),
# loop.run_in_executor(ex, f), future.add_done_callback(f), _thread.start_new_thread(f, args).
_THREAD_CTORS = frozenset({"Thread", "Timer"})
SPAWN_NAMES = _THREAD_CTORS | {"submit", "add_done_callback", "start_new_thread", "run_in_executor"}


def spawn_target(node: ast.Call) -> ast.expr | None:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    target = None
    if name in _THREAD_CTORS:
        target = next((k.value for k in node.keywords if k.arg in ("target", "function")), None)
        if target is None and name == "Timer" and len(node.args) >= 2:
            target = node.args[1]
    elif name in ("submit", "add_done_callback", "start_new_thread") and node.args:
        target = node.args[0]
    elif name == "run_in_executor" and len(node.args) >= 2:
        target = node.args[1]
    if isinstance(target, ast.Call) and (N.dotted(target.func) or "").endswith("partial") and target.args:
        target = target.args[0]  # functools.partial(f, ...)
    return target if isinstance(target, (ast.Name, ast.Attribute)) else None


# Calls that change the container they are called on: a thread that calls them writes that field.
MUTATORS = frozenset(
    {
        "append",
        "appendleft",
        "extend",
        "extendleft",
        "insert",
        "add",
        "update",
        "pop",
        "popleft",
        "popitem",
        "remove",
        "discard",
        "clear",
        "put",
        "put_nowait",
        "setdefault",
        "__setitem__",
    }
)

"""The collective recorder: runs inside every rank (installed by sitecustomize).

Every capture route (the torch.distributed wrappers in wrappers.py, and any
other) calls one hot-path entry, record_collective(), then record_complete().
A call is one fixed-size binary record written through a MAP_SHARED mmap of
rank{R}-{pid}.ring; names, call sites, shapes and groups are interned once in
the JSON side table rank{R}-{pid}.jsonl (format: records.py). No JSON and no
system call per collective, and the trace survives SIGKILL and gloo's abort.
No collective is ever issued by the recorder itself.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import mmap
import os
import signal
import socket
import sys
import threading
import time
import weakref

from hctool.consensus.records import (CALL, DONE, FLAG_ASYNC, FORMAT_VERSION, KIND_CALL, KIND_VOID, NO_ROOT,
                                      PER_SEGMENT, RECORD_SIZE, SEGMENT, STATE_COMPLETED, STATE_FAILED,
                                      T_DONE_OFFSET)

STACK_DEPTH = 8
_HCTOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_monotonic = time.monotonic
_get_ident = threading.get_ident
P2P = {"send": "send", "isend": "send", "send_object_list": "send",
       "recv": "recv", "irecv": "recv", "recv_object_list": "recv"}


class _Group:
    __slots__ = ("id", "key", "ranks", "member", "seq", "pg")

    def __init__(self, gid: int, key: str, ranks: list[int], member: bool, pg) -> None:
        self.id, self.key, self.ranks, self.member = gid, key, ranks, member
        self.seq = itertools.count()  # next() is atomic under the GIL
        # A weak reference: keeping a destroyed group alive until interpreter exit
        # makes gloo's threads die in the wrong order (std::terminate). When it
        # goes, its id may be reused: forget the mapping.
        self.pg = None if pg is None else weakref.ref(pg, lambda _, k=id(pg): _S.groups.pop(k, None))


class _State:
    def __init__(self) -> None:
        self.trace_dir: str | None = None
        self.internal: tuple[str, ...] = (_HCTOOL_DIR,)   # torch's folder is added when it is patched
        self.lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        self.fd: int | None = None      # side table
        self.ring_fd: int | None = None
        self.segs: list[mmap.mmap] = []
        self.slots = itertools.count()
        self.label_ids = itertools.count(1)
        self.label_seq = itertools.count()
        self.rank: int | None = None
        self.world: _Group | None = None  # the default group
        self.groups: dict[int, _Group] = {}  # id(pg) -> group
        self.group_ids = itertools.count(1)   # creation index of new_group (0: the default group)
        self.group_uids = itertools.count(1)  # the id ring records carry
        self.interned: dict[str, dict] = {k: {} for k in ("op", "site", "desc", "th", "ro")}
        self.code_internal: dict = {}
        self.ro_by_id: dict[int, int] = {}
        self.keep: list = []  # objects whose id() is part of a key
        self.error: str | None = None
        self.dist = None                  # torch.distributed, once imported


_S = _State()


def enabled() -> bool:
    return _S.trace_dir is not None


# ---------------------------------------------------------------- files

def _open() -> int:
    with _S.lock:
        if _S.fd is not None:
            return _S.fd
        dist = _S.dist
        live = dist is not None and dist.is_initialized()
        rank = str(dist.get_rank()) if live else os.environ.get("RANK")
        world = str(dist.get_world_size()) if live else os.environ.get("WORLD_SIZE")
        _S.rank = int(rank) if rank is not None else None
        os.makedirs(_S.trace_dir, exist_ok=True)
        base = os.path.join(_S.trace_dir, f"rank{rank if rank is not None else 'X'}-{os.getpid()}")
        fd = os.open(base + ".jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        header = {"hdr": FORMAT_VERSION, "rank": _S.rank, "world_size": int(world) if world else None,
                  "pid": os.getpid(), "host": socket.gethostname(), "argv": sys.argv[:20],
                  "start": time.time(), "mono": time.monotonic(), "record_size": RECORD_SIZE}
        os.write(fd, (json.dumps(header) + "\n").encode())
        _S.ring_fd = os.open(base + ".ring", os.O_RDWR | os.O_CREAT, 0o644)
        _S.fd = fd
        _register_faulthandler(base + ".stack")
        atexit.register(_write_end)
        return fd


def _side(record: dict) -> None:
    """One side-table line; os.write on O_APPEND keeps lines whole."""
    fd = _S.fd if _S.fd is not None else _open()
    os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def _grow(index: int) -> mmap.mmap:
    with _S.lock:
        while len(_S.segs) <= index:
            n = len(_S.segs)
            os.ftruncate(_S.ring_fd, (n + 1) * SEGMENT)
            _S.segs.append(mmap.mmap(_S.ring_fd, SEGMENT, mmap.MAP_SHARED, offset=n * SEGMENT))
        return _S.segs[index]


def _intern(kind: str, key, make) -> int:
    """The id of `key` in the side table, writing its value (make()) the first time."""
    table = _S.interned[kind]
    with _S.lock:
        ident = table.get(key)
        if ident is None:
            ident = len(table) + 1
            _side({"i": kind, "id": ident, "v": make()})  # written before any record uses the id
            table[key] = ident
        return ident


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) must not write into its parent's ring slots.
    trace_dir, internal = _S.trace_dir, _S.internal
    dist = _S.dist
    _S.lock = threading.RLock()
    _S.reset()
    _S.trace_dir, _S.internal, _S.dist = trace_dir, internal, dist


os.register_at_fork(after_in_child=_after_fork_in_child)


def _register_faulthandler(path: str) -> None:
    # Fallback for hctool.stacks when ptrace is denied: SIGUSR1 dumps all threads.
    import faulthandler
    try:
        if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
            faulthandler.register(signal.SIGUSR1, file=open(path, "w"), all_threads=True)  # noqa: SIM115
    except (ValueError, OSError, RuntimeError):
        pass  # not in a state where a handler can be registered; py-spy remains


def _write_end() -> None:
    rec = {"end": 1, "t": time.monotonic()}
    if _S.error:
        rec["error"] = _S.error
    try:
        _side(rec)
    except OSError:
        pass


def excepthook(orig):
    def hook(exc_type, exc, tb):
        _S.error = f"{exc_type.__name__}: {exc}"[:300]
        return orig(exc_type, exc, tb)
    return hook


_failed_once = False


def note_failure(exc: Exception) -> None:
    global _failed_once
    if not _failed_once:
        _failed_once = True
        sys.stderr.write(f"hctool: recorder error (recording continues where possible): {type(exc).__name__}: {exc}\n")


# ---------------------------------------------------------------- interning what a call is

def _user_frame(frame):
    """The first frame outside torch and hctool (None if there is none)."""
    cache = _S.code_internal  # keyed by id(code): hashing a code object hashes its contents (slow)
    while frame is not None:
        code = frame.f_code
        internal = cache.get(id(code))
        if internal is None:
            path = code.co_filename
            internal = path.startswith(_S.internal) or path.startswith("<frozen")
            cache[id(code)] = internal
            _S.keep.append(code)  # alive, so its id is never reused
        if not internal:
            return frame
        frame = frame.f_back
    return None


def _new_site(frame) -> dict:
    _S.keep.extend((frame.f_code, frame.f_back and frame.f_back.f_code))  # ids in site keys stay unique
    return _site_value(frame)


def _site_value(frame) -> dict:
    stack = []
    f = frame
    while f is not None and len(stack) < STACK_DEPTH:
        stack.append(f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}")
        f = f.f_back
    return {"site": f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}", "fn": frame.f_code.co_name,
            "stack": stack}


def describe(x) -> dict:
    """{"sh": shapes, "dt": dtypes} of what a rank contributes."""
    shape = getattr(x, "shape", None)
    if shape is not None:
        return {"sh": [list(shape)], "dt": [str(x.dtype).replace("torch.", "")]}
    if isinstance(x, (list, tuple)):
        if x and all(hasattr(t, "shape") for t in x):
            return {"sh": [list(t.shape) for t in x], "dt": [str(t.dtype).replace("torch.", "") for t in x]}
        return {"sh": [[len(x)]], "dt": ["object"]}
    return {"sh": [], "dt": []} if x is None else {"sh": [[1]], "dt": ["object"]}


def _describe_p2p(ops) -> dict:
    out = []
    for p in ops or ():
        d = describe(p.tensor)
        out.append(["send" if getattr(p.op, "__name__", "").endswith("send") else "recv", p.peer, d["sh"], d["dt"]])
    return {"p2p": out}


def _desc_id(op: str, x) -> int:
    shape = getattr(x, "shape", None)
    if shape is not None:
        key = (shape, x.dtype)
    elif op == "batch_isend_irecv":
        value = _describe_p2p(x)
        return _intern("desc", json.dumps(value), lambda: value)
    elif isinstance(x, (list, tuple)):
        key = tuple((getattr(t, "shape", None), getattr(t, "dtype", None)) for t in x)
        if any(s is None for s, _ in key):
            key = ("objects", len(x))
    else:
        key = ("none",) if x is None else ("object",)
    ident = _S.interned["desc"].get(key)
    return ident if ident is not None else _intern("desc", key, lambda: describe(x))


def _reduce_id(ro) -> int:
    obj = ro
    try:
        ident = _S.interned["ro"].get(ro)
    except TypeError:  # an unhashable ReduceOp (PREMUL_SUM with a factor)
        ro = str(ro)
        ident = _S.interned["ro"].get(ro)
    if ident is None:
        ident = _intern("ro", ro, lambda: getattr(ro, "name", None) or str(ro).rsplit(".", 1)[-1])
    if len(_S.ro_by_id) < 64:  # keeps obj alive, so its id is never reused
        _S.ro_by_id[id(obj)] = ident
        _S.keep.append(obj)
    return ident


def _thread_id() -> int:
    ident = _S.interned["th"].get(_get_ident())
    return ident if ident is not None else _intern("th", _get_ident(), lambda: threading.current_thread().name)


# ---------------------------------------------------------------- groups

def register_group(pg, ranks: list[int], default: bool = False) -> _Group:
    """A group gets an id and a key "<creation index>:[ranks]" (index 0: the default group)."""
    ranks = sorted(ranks)
    if _S.fd is None:
        _open()
    idx = 0 if default else next(_S.group_ids)
    key = f"{idx}:" + json.dumps(ranks, separators=(",", ":"))
    g = _Group(next(_S.group_uids), key, ranks, _S.rank is None or _S.rank in ranks, pg)
    _side({"grp": key, "idx": idx, "ranks": ranks, "id": g.id})
    if default:
        _S.world = g
        _S.group_ids = itertools.count(1)
    if pg is not None:
        _S.groups[id(pg)] = g
    return g


def _group(group) -> _Group | None:
    dist = _S.dist
    if dist is None or not dist.is_initialized():
        return None
    if _S.world is None:
        register_group(dist.distributed_c10d._get_default_group(), list(range(dist.get_world_size())), default=True)
    if group is None:
        return _S.world
    g = _S.groups.get(id(group))
    if g is None:  # created before the recorder was installed, or by a private API
        ranks = sorted(dist.get_process_group_ranks(group))
        idx = f"?{getattr(group, 'group_name', id(group))}"
        key = f"{idx}:" + json.dumps(ranks, separators=(",", ":"))
        g = _Group(next(_S.group_uids), key, ranks, _S.rank in ranks, group)
        _side({"grp": g.key, "idx": idx, "ranks": ranks, "id": g.id})
        _S.groups[id(group)] = g
    return g


# ---------------------------------------------------------------- the hot path

def record_collective(op: str, group, tensors, *, reduce_op=None, root=None, async_op: bool = False,
                      frame=None) -> int:
    """Record that this rank entered collective `op` on `group` (None: the default
    group). `tensors`: what this rank contributes (a tensor, a list of tensors, an
    object list, or for "batch_isend_irecv" the P2POp list). `root`: the root of
    a rooted op, or the peer of a p2p op. `frame`: the Python frame to attribute
    the call to (default: the first frame outside torch and hctool on the calling
    thread). Returns a token for record_complete, 0 when nothing was recorded
    (recorder off, or this rank is not a member). Never raises."""
    S = _S
    if S.trace_dir is None:
        return 0
    slot = -1
    try:
        g = S.world if group is None else S.groups.get(id(group))
        if g is None:
            g = _group(group)
            if g is None:
                return 0
        if not g.member:
            return 0  # torch returns early for non-members
        # Fast paths inline (a Python call costs ~0.1 us here); first sightings go to _intern.
        interned = S.interned
        opid = interned["op"].get(op) or _intern("op", op, lambda: op)
        f = frame if frame is not None else sys._getframe(1)
        if S.code_internal.get(id(f.f_code)) is not False:  # not already known to be a user frame
            f = _user_frame(f)
            if f is None and threading.current_thread() is not threading.main_thread():
                # autograd's device threads and C++ threads hold no user frame: the user's
                # line is where the main thread is now (e.g. its `loss.backward()`)
                f = _user_frame(sys._current_frames().get(threading.main_thread().ident))
        if f is None:
            site = 0
        else:
            back = f.f_back
            key = (id(f.f_code), f.f_lasti, id(back.f_code), back.f_lasti) if back is not None else (id(f.f_code), f.f_lasti)
            site = interned["site"].get(key) or _intern("site", key, lambda: _new_site(f))
        shape = getattr(tensors, "shape", None)
        desc = interned["desc"].get((shape, tensors.dtype)) if shape is not None else None
        if desc is None:
            desc = _desc_id(op, tensors)
        # by identity: ReduceOp members are singletons and pybind hashing is slow
        ro = 0 if reduce_op is None else (S.ro_by_id.get(id(reduce_op)) or _reduce_id(reduce_op))
        th = interned["th"].get(_get_ident()) or _thread_id()
        seq = next(g.seq)
        slot = next(S.slots)
        segs = S.segs
        index = slot // PER_SEGMENT
        mm = segs[index] if index < len(segs) else _grow(index)
        off = (slot % PER_SEGMENT) * RECORD_SIZE
        CALL.pack_into(mm, off, 0, 1, FLAG_ASYNC if async_op else 0, opid, g.id, site, desc, th, ro,
                       NO_ROOT if root is None else root, seq, _monotonic(), 0.0)
        mm[off] = KIND_CALL  # last: the record is whole once its kind byte is set
        return slot + 1
    except Exception as exc:  # never break the program
        if slot >= 0:
            _void(slot)
        note_failure(exc)
        return 0


def _void(slot: int) -> None:
    # A slot taken but not filled would stop readers at it: mark it void.
    try:
        S = _S
        index = slot // PER_SEGMENT
        mm = S.segs[index] if index < len(S.segs) else _grow(index)
        mm[(slot % PER_SEGMENT) * RECORD_SIZE] = KIND_VOID
    except Exception:
        pass


def record_complete(token: int, ok: bool = True, error: str | None = None) -> None:
    """The call of `token` returned (ok) or raised (error: its text)."""
    if not token:
        return
    try:
        slot = token - 1
        off = (slot % PER_SEGMENT) * RECORD_SIZE
        mm = _S.segs[slot // PER_SEGMENT]
        if not ok:
            _side({"xr": token, "err": (error or "failed")[:300]})
        DONE.pack_into(mm, off + T_DONE_OFFSET, _monotonic())
        mm[off + 1] = STATE_COMPLETED if ok else STATE_FAILED
    except Exception as exc:
        note_failure(exc)


# ---------------------------------------------------------------- labelled events

def record_label(label: str, value, depth: int = 2) -> None:
    if _S.trace_dir is None:
        return
    try:
        digest = hashlib.sha1(_canonical(value)).hexdigest()[:16]
        site = _site_value(_user_frame(sys._getframe(depth)) or sys._getframe(depth))
        _side({"e": next(_S.label_ids), "g": "labels", "s": next(_S.label_seq), "op": "assert_same",
               "label": str(label), "digest": digest, "value": repr(value)[:80], "st": "c", **site,
               "th": threading.current_thread().name, "t": time.monotonic(), "w": time.time()})
    except Exception as exc:
        note_failure(exc)


def _canonical(value) -> bytes:
    """Bytes that are equal across processes iff the values are (str hashing is
    randomized per process, so sets and dicts are sorted)."""
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        t = value.detach().cpu().contiguous()
        return repr((tuple(t.shape), str(t.dtype))).encode() + t.numpy().tobytes()
    if isinstance(value, dict):
        return b"{" + b",".join(sorted(_canonical(k) + b":" + _canonical(v) for k, v in value.items())) + b"}"
    if isinstance(value, (set, frozenset)):
        return b"set(" + b",".join(sorted(_canonical(v) for v in value)) + b")"
    if isinstance(value, (list, tuple)):
        return b"[" + b",".join(_canonical(v) for v in value) + b"]"
    return repr(value).encode()


def install_on_import(trace_dir: str) -> None:
    """Turn the recorder on and wrap torch.distributed when it is first imported."""
    from hctool.consensus import wrappers

    _S.trace_dir = os.path.abspath(trace_dir)
    sys.excepthook = excepthook(sys.excepthook)
    wrappers.install_on_import()

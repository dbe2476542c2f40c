"""The recorder's files and interned names: the side table (JSON lines, os.write), the
mmap'd ring segments, interning of ops, call sites, shapes, reduce ops and threads, and
process groups. state.py holds the process state, recorder.py the hot path that uses
these, hctool/protocol/records.py the format.
"""

from __future__ import annotations

import atexit
import errno
import itertools
import json
import mmap
import os
import signal
import socket
import sys
import threading

from hctool.agent.capture.cxx_kernel import counter_value as cxx_counter_value
from hctool.agent.capture.state import _S, _Group
from hctool.agent.clock import REAL
from hctool.protocol.records import FORMAT_VERSION, PER_SEGMENT, RECORD_SIZE, SEGMENT
from hctool.protocol.safefile import create_exclusive

STACK_DEPTH = 8
_get_ident = threading.get_ident
_get_native_id = threading.get_native_id


# ---------------------------------------------------------------- files
# Freed when recording stops on a full disk: room for the stop mark and the end record.
RESERVE_BYTES = 64 << 10


def _open() -> int:
    with _S.lock:
        if _S.fd is not None:
            return _S.fd
        if _S.trace_dir is None:
            raise OSError(errno.EPERM, "recording is off in this process")
        dist = _S.dist
        live = dist is not None and dist.is_initialized()
        rank = str(dist.get_rank()) if live else os.environ.get("RANK")
        world = str(dist.get_world_size()) if live else os.environ.get("WORLD_SIZE")
        _S.rank = int(rank) if rank is not None else None
        os.makedirs(_S.trace_dir, exist_ok=True)
        name = f"rank{rank if rank is not None else 'X'}-{os.getpid()}"
        base = os.path.join(_S.trace_dir, name)
        try:  # new files only (O_EXCL|O_NOFOLLOW): the folder may be shared, a planted link is refused
            fd = create_exclusive(base + ".jsonl", os.O_WRONLY | os.O_APPEND)
            try:
                ring_fd = create_exclusive(base + ".ring", os.O_RDWR)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            _S.trace_dir, _S.stopped = None, True  # every capture route checks it
            sys.stderr.write(
                f"hctool: recording is off in this process: cannot create {base}.jsonl/.ring "
                f"({exc.strerror}; something else wrote into the trace folder?)\n"
            )
            raise
        header = {
            "hdr": FORMAT_VERSION,
            "rank": _S.rank,
            "world_size": int(world) if world else None,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "argv": sys.argv[:20],
            "start": REAL.time(),
            "mono": REAL.monotonic(),
            "record_size": RECORD_SIZE,
            "fastpath": _S.fastpath,
            "c10d_kernel": _S.c10d_kernel,
        }
        run = _S.run_id
        if run:
            header["run"] = run  # the reader keeps only the files of the run that claimed the folder
        _S.fd, _S.ring_fd = fd, ring_fd
        _side(header)
        _reserve(os.path.join(_S.trace_dir, f".{name}.reserve"))
        _register_faulthandler(base + ".stack")
        atexit.register(write_end)
        return fd


def _reserve(path: str) -> None:
    try:
        fd = create_exclusive(path)
    except OSError:
        return  # something is in the way (planted?): go without the reserve
    _S.reserve = path
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError as exc:
        stop_recording(exc, 0)
    finally:
        os.close(fd)


def _side(record: dict) -> None:
    """One side-table line; os.write on O_APPEND keeps lines whole. A write that fails (a full
    disk) stops recording, then is tried once more in the room the reserve left."""
    with _S.lock:
        fd = _S.fd if _S.fd is not None else _open()
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        try:
            _write_line(fd, line)
        except OSError as exc:
            if _S.stopped:
                raise
            stop_recording(exc, _slot_now())
            _write_line(fd, line)


def _write_line(fd: int, line: bytes) -> None:
    n = os.write(fd, line)
    if n < len(line):  # the disk filled mid-line: cut it off, so the file holds whole lines only
        os.ftruncate(fd, os.fstat(fd).st_size - n)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _grow(index: int) -> mmap.mmap:
    with _S.lock:
        while len(_S.segs) <= index:
            if _S.stopped:
                raise OSError(errno.ENOSPC, "recording stopped")
            n = len(_S.segs)
            try:  # reserved before it is mapped: a full disk fails here, never as a SIGBUS in the program
                os.posix_fallocate(_S.ring_fd, n * SEGMENT, SEGMENT)
            except OSError as exc:
                stop_recording(exc, n * PER_SEGMENT)
                raise
            _S.segs.append(mmap.mmap(_S.ring_fd, SEGMENT, mmap.MAP_SHARED, offset=n * SEGMENT))
        return _S.segs[index]


def stop_recording(exc: OSError, slot: int) -> None:
    """The trace folder cannot take more (ENOSPC, EFBIG, EDQUOT...): record nothing more, say so
    once, and leave a trace_truncated mark; the program runs on. Idempotent."""
    with _S.lock:
        if _S.stopped:
            return
        _S.stopped = True
        _S.trace_dir = None  # every capture route checks it: no call is recorded from now on
        _free_reserve()
        why = errno.errorcode.get(exc.errno, "OSError") if exc.errno else type(exc).__name__
        sys.stderr.write(
            f"hctool: the trace folder cannot take more ({exc.strerror or exc}): recording stopped "
            f"after {slot} calls of this process; the program goes on\n"
        )
        if _S.fd is not None:
            try:
                _write_line(
                    _S.fd, (json.dumps({"trace_truncated": why, "slot": slot, "t": REAL.monotonic()}) + "\n").encode()
                )
            except OSError:
                pass


def _slot_now() -> int:
    return cxx_counter_value(_S.slots)


def _free_reserve() -> None:
    path, _S.reserve = _S.reserve, None
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


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
    # Fallback for hctool.supervise.stacks when ptrace is denied: SIGUSR1 dumps all threads.
    import faulthandler

    try:
        if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
            stack = REAL.open(create_exclusive(path), "w")  # noqa: SIM115  (never through a planted link)
            faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    except (ValueError, OSError, RuntimeError):
        pass  # not in a state where a handler can be registered; py-spy remains


def write_end() -> None:
    """The end record (atexit writes it; a process leaving by os._exit calls it first)."""
    rec = {"end": 1, "t": REAL.monotonic()}
    if _S.error:
        rec["error"] = _S.error
    try:
        _side(rec)
    except OSError:
        pass
    _free_reserve()


def excepthook(orig):
    def hook(exc_type, exc, tb):
        _S.error = f"{exc_type.__name__}: {exc}"[:300]
        return orig(exc_type, exc, tb)

    return hook


_failed_once = False


def note_failure(exc: Exception) -> None:
    global _failed_once
    if not _failed_once and not _S.stopped:  # a stop said its own line
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
            internal = path.startswith(_S.internal)
            cache[id(code)] = internal
            _S.keep.append(code)  # alive, so its id is never reused
        if not internal:
            return frame
        frame = frame.f_back
    return None


def _new_site(frame, back=None) -> dict:
    """The site of `frame`, called from `back` (its caller beyond any hctool wrapper)."""
    back = back if back is not None else frame.f_back
    _S.keep.extend((frame.f_code, back and back.f_code))  # ids in site keys stay unique
    return _site_value(frame)


def _site_value(frame) -> dict:
    stack = []
    f = frame
    while f is not None and len(stack) < STACK_DEPTH:
        if not f.f_code.co_filename.startswith(_S.internal[0]):  # hctool's own frames (a probe's wrapper)
            stack.append(f"{f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}")
        f = f.f_back
    return {
        "site": f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}",
        "fn": frame.f_code.co_name,
        "stack": stack,
    }


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
    # Keyed by the OS thread id: a pthread ident is reused as soon as its thread ends (glibc
    # reuses the descriptor), which named a new thread after a finished one.
    native = _get_native_id()
    ident = _S.interned["th"].get(native)
    return ident if ident is not None else _intern("th", native, lambda: threading.current_thread().name)


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
    if g is None and group is dist.GroupMember.NON_GROUP_MEMBER:
        return None  # new_group's answer on a rank outside the group: torch returns early
    if g is None:  # created before the recorder was installed, or by a private API
        ranks = sorted(dist.get_process_group_ranks(group))
        idx = f"?{getattr(group, 'group_name', id(group))}"
        key = f"{idx}:" + json.dumps(ranks, separators=(",", ":"))
        g = _Group(next(_S.group_uids), key, ranks, _S.rank in ranks, group)
        _side({"grp": g.key, "idx": idx, "ranks": ranks, "id": g.id})
        _S.groups[id(group)] = g
    return g

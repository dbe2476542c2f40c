"""The collective recorder's hot path: runs inside every rank (install.py turns it on).

Every capture route (the torch.distributed wrappers in wrappers.py, the dispatcher kernels
of c10d.py, funcol.py) calls one entry, record_collective(), then record_complete(). A call
is one fixed-size binary record written through a MAP_SHARED mmap of rank{R}-{pid}.ring;
names, call sites, shapes and groups are interned once in the JSON side table
rank{R}-{pid}.jsonl (tracefile.py; format: hctool/protocol/records.py). No JSON and no
system call per collective, and the trace survives SIGKILL and gloo's abort. No collective
is ever issued by the recorder itself.
"""

from __future__ import annotations

import hashlib
import sys
import threading

from hctool.agent.capture.state import _S, enabled  # noqa: F401 - recorder.enabled() is its API
from hctool.agent.capture.tracefile import (
    _desc_id,
    _group,
    _grow,
    _intern,
    _new_site,
    _reduce_id,
    _side,
    _site_value,
    _thread_id,
    _user_frame,
    note_failure,
)
from hctool.agent.clock import REAL
from hctool.protocol.records import (
    CALL,
    DONE,
    FLAG_ASYNC,
    KIND_CALL,
    KIND_VOID,
    NO_ROOT,
    PER_SEGMENT,
    RECORD_SIZE,
    STATE_COMPLETED,
    STATE_FAILED,
    T_DONE_OFFSET,
    bounded_label,
)

_monotonic = REAL.monotonic  # the real clock: clock faults skew the program's, not the trace's
_get_ident = threading.get_ident
_get_native_id = threading.get_native_id
P2P = {
    "send": "send",
    "isend": "send",
    "send_object_list": "send",
    "recv": "recv",
    "irecv": "recv",
    "recv_object_list": "recv",
}


# ---------------------------------------------------------------- the hot path


def record_collective(op: str, group, tensors, *, reduce_op=None, root=None, async_op: bool = False, frame=None) -> int:
    """Record that this rank entered collective `op` on `group` (None: the default
    group). `tensors`: what this rank contributes (a tensor, a list of tensors, an
    object list, or for "batch_isend_irecv" the P2POp list). `root`: the root of
    a rooted op, or the peer of a p2p op. `frame`: the Python frame to attribute
    the call to (default: the first frame outside torch and hctool on the calling
    thread). Returns a token for record_complete, 0 when nothing was recorded
    (recorder off, or this rank is not a member). Never raises."""
    return _record(
        op, group, tensors, reduce_op, root, async_op, frame if frame is not None else sys._getframe(1), _get_ident()
    )


def _record(op: str, group, tensors, reduce_op, root, async_op: bool, f, ident: int) -> int:
    """record_collective with every argument given, positionally: the wrappers' hot path
    (keyword binding and a second thread-id lookup cost ~0.2 us a call)."""
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
        site = 0
        if S.code_internal.get(id(f.f_code)) is not False:  # not already known to be a user frame
            f = _user_frame(f)
            main = threading.main_thread().ident
            if f is None and ident != main:
                # autograd's device threads and C++ threads hold no user frame: the user's line
                # is the main thread's backward call in progress (wrappers.py publishes it; the
                # C++ kernel applies the same rule), else where the main thread is now. Not
                # threading.current_thread(): on a C++ thread it builds a _DummyThread.
                site = S.backward_site
                if not site:
                    f = _user_frame(sys._current_frames().get(main))
        if not site and f is not None:
            back = f.f_back
            if back is not None and S.code_internal.get(id(back.f_code)) is not False:
                back = _user_frame(back)  # one of our wrappers (a probe) sits between the call and its caller
            key = (
                (id(f.f_code), f.f_lasti, id(back.f_code), back.f_lasti)
                if back is not None
                else (id(f.f_code), f.f_lasti)
            )
            site = interned["site"].get(key) or _intern("site", key, lambda: _new_site(f, back))
        shape = getattr(tensors, "shape", None)
        desc = interned["desc"].get((shape, tensors.dtype)) if shape is not None else None
        if desc is None:
            desc = _desc_id(op, tensors)
        # by identity: ReduceOp members are singletons and pybind hashing is slow
        ro = 0 if reduce_op is None else (S.ro_by_id.get(id(reduce_op)) or _reduce_id(reduce_op))
        th = interned["th"].get(_get_native_id()) or _thread_id()
        seq = next(g.seq)
        slot = next(S.slots)
        segs = S.segs
        index = slot // PER_SEGMENT
        mm = segs[index] if index < len(segs) else _grow(index)
        off = (slot % PER_SEGMENT) * RECORD_SIZE
        CALL.pack_into(
            mm,
            off,
            0,
            1,
            FLAG_ASYNC if async_op else 0,
            opid,
            g.id,
            site,
            desc,
            th,
            ro,
            NO_ROOT if root is None else root,
            seq,
            _monotonic(),
            0.0,
        )
        mm[off] = KIND_CALL  # last: the record is whole once its kind byte is set
        return slot + 1
    except Exception as exc:  # never break the program
        if slot >= 0:
            _void(slot)
        note_failure(exc)
        return 0


def site_of(frame) -> int:
    """The site id of the first user frame from `frame` outward (0: none), as _record interns it
    (_record keeps its own inline copy of the key: a call costs ~0.1 us on its hot path)."""
    f = _user_frame(frame)
    if f is None:
        return 0
    back = f.f_back
    if back is not None and _S.code_internal.get(id(back.f_code)) is not False:
        back = _user_frame(back)
    key = (id(f.f_code), f.f_lasti, id(back.f_code), back.f_lasti) if back is not None else (id(f.f_code), f.f_lasti)
    return _S.interned["site"].get(key) or _intern("site", key, lambda: _new_site(f, back))


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


def record_failed(token: int, exc: BaseException) -> None:
    """The call of `token` raised `exc` (every capture route says it this way)."""
    record_complete(token, ok=False, error=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- labelled events


def record_label(label: str, value, depth: int = 2, frame=None) -> None:
    """A labelled value at the caller `depth` frames up (or at `frame`, when given)."""
    if _S.trace_dir is None:
        return
    try:
        digest = hashlib.sha1(_canonical(value)).hexdigest()[:16]
        at = frame if frame is not None else sys._getframe(depth)
        site = _site_value(_user_frame(at) or at)
        _side(
            {
                "e": next(_S.label_ids),
                "g": "labels",
                "s": next(_S.label_seq),
                "op": "assert_same",
                "label": bounded_label(str(label)),
                "digest": digest,
                "value": repr(value)[:80],
                "st": "c",
                **site,
                "th": threading.current_thread().name,
                "t": REAL.monotonic(),
                "w": REAL.time(),
            }
        )
    except Exception as exc:
        note_failure(exc)


def record_group_creation(ranks, frame) -> int:
    """This rank entered new_group(ranks) at `frame` (every rank must, in one order): an event
    of the "groups" sequence, completed by record_group_created(). Returns its id (0: not recorded)."""
    if _S.trace_dir is None:
        return 0
    try:
        ident = next(_S.label_ids)
        site = _site_value(_user_frame(frame) or frame)
        members = "all" if ranks is None else json_ranks(ranks)
        _side(
            {
                "e": ident,
                "g": "groups",
                "s": next(_S.group_seq),
                "op": "new_group",
                "label": members,
                "digest": None,
                **site,
                "th": threading.current_thread().name,
                "t": REAL.monotonic(),
                "w": REAL.time(),
            }
        )
        return ident
    except Exception as exc:
        note_failure(exc)
        return 0


def record_group_created(ident: int, ok: bool = True) -> None:
    if not ident or _S.trace_dir is None:
        return
    try:
        _side({"c" if ok else "x": ident, "t": REAL.monotonic()})
    except Exception as exc:
        note_failure(exc)


def json_ranks(ranks) -> str:
    return "[" + ",".join(str(int(r)) for r in sorted(ranks)) + "]"


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

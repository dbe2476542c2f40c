"""The collective recorder: runs inside every rank (installed by sitecustomize).

Wraps the public collectives, p2p calls and object collectives of
torch.distributed and appends one JSON line per state change to
HCTOOL_TRACE_DIR/rank{RANK}-{pid}.jsonl through an O_APPEND fd, so the trace
survives SIGKILL and gloo's abort. Record kinds (keys are short: this is the
hot path):
  {"hdr":1, rank, world_size, pid, host, argv, start, mono}      first line
  {"grp": "<idx>:[ranks]", "idx", "ranks"}                        group created
  {"e": id, "g", "s", "op", "sh", "dt", "ro", "root", "peer", "async",
   "site", "fn", "stack", "th", "t", "w"[, "label", "digest", "st": "c"]}  entered
  {"c": id, "t"}  completed            {"x": id, "err", "t"}  raised
  {"end": 1, "t"[, "error"]}           interpreter exiting (atexit)
No collective is ever issued by the recorder itself.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.machinery
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time

STACK_DEPTH = 8
_HCTOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_INTERNAL: tuple[str, ...] = (_HCTOOL_DIR,)  # torch's folder is added when it is patched

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier", "broadcast_object_list", "all_gather_object", "gather_object",
    "scatter_object_list",
)
P2P = {"send": "send", "isend": "send", "send_object_list": "send",
       "recv": "recv", "irecv": "recv", "recv_object_list": "recv"}
# The argument that describes what a rank contributes (default: the first parameter).
_DESCRIBED_ARG = {"all_gather": "tensor", "all_gather_into_tensor": "input_tensor",
                  "reduce_scatter_tensor": "input", "all_to_all_single": "input",
                  "all_to_all": "input_tensor_list", "all_gather_object": "object_list",
                  "gather_object": "obj", "scatter_object_list": "scatter_object_output_list"}
_ROOT_ARGS = ("src", "dst", "group_src", "group_dst")


class _State:
    def __init__(self) -> None:
        self.trace_dir: str | None = None
        self.fd: int | None = None
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.seq: dict[str, int] = {}
        self.groups: dict[int, tuple[object, str, list[int]]] = {}  # id(pg) -> (pg, key, ranks)
        self.next_group_idx = 1
        self.default_key: str | None = None
        self.rank: int | None = None
        self.frame_cache: dict[tuple, tuple[str, str, str, bool]] = {}
        self.stack_json: dict[tuple, str] = {}
        self.error: str | None = None


_S = _State()
_tls = threading.local()
_dist = None  # torch.distributed, once imported


def enabled() -> bool:
    return _S.trace_dir is not None


# ---------------------------------------------------------------- writing

def _open() -> int:
    if _S.fd is None:
        rank = os.environ.get("RANK")
        if rank is None and _dist is not None and _dist.is_initialized():
            rank = str(_dist.get_rank())
        world = os.environ.get("WORLD_SIZE")
        if _dist is not None and _dist.is_initialized():
            world = str(_dist.get_world_size())
        _S.rank = int(rank) if rank is not None else None
        os.makedirs(_S.trace_dir, exist_ok=True)
        base = os.path.join(_S.trace_dir, f"rank{rank if rank is not None else 'X'}-{os.getpid()}")
        fd = os.open(base + ".jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        header = {"hdr": 1, "rank": _S.rank, "world_size": int(world) if world else None,
                  "pid": os.getpid(), "host": socket.gethostname(), "argv": sys.argv,
                  "start": time.time(), "mono": time.monotonic()}
        os.write(fd, (json.dumps(header) + "\n").encode())
        _S.fd = fd
        _register_faulthandler(base + ".stack")
        atexit.register(_write_end)
    return _S.fd


def _write(record: dict) -> None:
    _write_line(json.dumps(record, separators=(",", ":")))


def _write_line(text: str) -> None:
    line = (text + "\n").encode()
    with _S.lock:
        os.write(_open(), line)


def _stack_json(stack: tuple) -> str:
    # A call site's short stack repeats on every call: serialize it once.
    text = _S.stack_json.get(stack)
    if text is None:
        text = _S.stack_json[stack] = json.dumps(list(stack), separators=(",", ":"))
    return text


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
        _write(rec)
    except OSError:
        pass


def _excepthook(orig):
    def hook(exc_type, exc, tb):
        _S.error = f"{exc_type.__name__}: {exc}"[:300]
        return orig(exc_type, exc, tb)
    return hook


# ---------------------------------------------------------------- describing a call

def _call_site(frame) -> tuple[str, str, tuple[str, ...]]:
    """(site "file.py:LINE", function, short stack innermost first) of the first
    frame outside torch and hctool."""
    cache = _S.frame_cache
    stack: list[str] = []
    site = fn = ""
    while frame is not None and len(stack) < STACK_DEPTH:
        key = (frame.f_code, frame.f_lineno)
        info = cache.get(key)
        if info is None:
            path = frame.f_code.co_filename
            internal = path.startswith(_INTERNAL) or path.startswith("<frozen")
            s = f"{os.path.basename(path)}:{frame.f_lineno}"
            info = cache[key] = (s, frame.f_code.co_name, f"{path}:{frame.f_lineno} {frame.f_code.co_name}", internal)
        if not stack:
            if info[3]:
                frame = frame.f_back
                continue
            site, fn = info[0], info[1]
        stack.append(info[2])
        frame = frame.f_back
    return site, fn, tuple(stack)


def _desc(x) -> tuple[list, list]:
    shape = getattr(x, "shape", None)
    if shape is not None:
        return [list(shape)], [str(x.dtype).replace("torch.", "")]
    if isinstance(x, (list, tuple)):
        if x and all(hasattr(t, "shape") for t in x):
            return [list(t.shape) for t in x], [str(t.dtype).replace("torch.", "") for t in x]
        return [[len(x)]], ["object"]
    if x is None:
        return [], []
    return [[1]], ["object"]


def _group_key(group) -> tuple[str | None, list[int] | None]:
    if group is None or (_dist is not None and group is _dist.GroupMember.WORLD):
        if _S.default_key is None:
            _register_default_group()
        return _S.default_key, None
    entry = _S.groups.get(id(group))
    if entry is None:  # created before the recorder was installed, or by a private API
        try:
            ranks = sorted(_dist.get_process_group_ranks(group))
        except Exception:
            return None, None
        key = f"?{getattr(group, 'group_name', id(group))}:{json.dumps(ranks, separators=(',', ':'))}"
        entry = _S.groups[id(group)] = (group, key, ranks)
    return entry[1], entry[2]


def _register_default_group() -> None:
    if _dist is None or not _dist.is_initialized():
        return
    ranks = list(range(_dist.get_world_size()))
    _S.default_key = "0:" + json.dumps(ranks, separators=(",", ":"))
    _write({"grp": _S.default_key, "idx": 0, "ranks": ranks})


def _desc_p2p(ops) -> list:
    out = []
    for p in ops or ():
        sh, dt = _desc(p.tensor)
        direction = "send" if getattr(p.op, "__name__", "").endswith("send") else "recv"
        out.append([direction, p.peer, sh, dt])
    return out


def _reduce_name(ro) -> str:
    return getattr(ro, "name", None) or str(ro).rsplit(".", 1)[-1]


# ---------------------------------------------------------------- the hot-path entry

def record_collective(op: str, group, tensors, *, reduce_op=None, root=None, async_op: bool = False,
                      frame=None) -> int:
    """Record that this rank entered collective `op` on `group` (None: the default
    group). `tensors`: what this rank contributes (a tensor, a list of tensors, an
    object list, or for "batch_isend_irecv" the P2POp list). `root`: the root of
    a rooted op, or the peer of a p2p op. `frame`: the Python frame to attribute
    the call to (default: the first frame outside torch and hctool on the calling
    thread). Returns a token for record_complete, 0 when nothing was recorded
    (recorder off, or this rank is not a member). Never raises."""
    if _S.trace_dir is None:
        return 0
    try:
        key, ranks = _group_key(group)
        if key is None or (ranks is not None and _S.rank is not None and _S.rank not in ranks):
            return 0  # torch returns early for non-members
        rec: dict = {"g": key, "op": op}
        if op == "batch_isend_irecv":
            rec["p2p"] = _desc_p2p(tensors)
        elif op in ("barrier", "monitored_barrier"):
            rec["sh"], rec["dt"] = [], []
        else:
            rec["sh"], rec["dt"] = _desc(tensors)
        if reduce_op is not None:
            rec["ro"] = _reduce_name(reduce_op)
        if op in P2P:
            rec["dir"], rec["peer"] = P2P[op], root
        elif root is not None:
            rec["root"] = root
        if async_op:
            rec["async"] = True
        eid = next(_S.ids)
        seq = _S.seq[key] = _S.seq.get(key, -1) + 1
        site, func, stack = _call_site(frame if frame is not None else sys._getframe(1))
        if not site and threading.current_thread() is not threading.main_thread():
            # autograd's device threads and C++ threads hold no user frame: the user's
            # line is where the main thread is now (e.g. its `loss.backward()`)
            site, func, stack = _call_site(sys._current_frames().get(threading.main_thread().ident))
        rec.update(e=eid, s=seq, site=site, fn=func, th=threading.current_thread().name,
                   t=time.monotonic(), w=time.time())
        _write_line(json.dumps(rec, separators=(",", ":"))[:-1] + ',"stack":' + _stack_json(stack) + "}")
        return eid
    except Exception as exc:  # never break the program
        _note_failure(exc)
        return 0


def record_complete(token: int, ok: bool = True, error: str | None = None) -> None:
    """The call of `token` returned (ok) or raised (error: its text)."""
    if not token:
        return
    try:
        if ok:
            _write_line(f'{{"c":{token},"t":{time.monotonic()!r}}}')
        else:
            _write({"x": token, "err": (error or "failed")[:300], "t": time.monotonic()})
    except Exception as exc:
        _note_failure(exc)


# ---------------------------------------------------------------- wrapping torch.distributed

def _extractor(op: str, fn):
    """(args, kwargs) -> (group, tensors, reduce_op, root, async_op), from fn's signature."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = tuple(p.name for p in params)
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    described = "p2p_op_list" if op == "batch_isend_irecv" else _DESCRIBED_ARG.get(op, names[0] if names else None)
    root_names = ("dst", "src", "group_dst", "group_src") if op in P2P else _ROOT_ARGS

    def extract(args, kwargs):
        bound = dict(defaults)
        bound.update(zip(names, args))
        bound.update(kwargs)
        group = bound.get("group")
        if op == "batch_isend_irecv":
            ops = bound.get("p2p_op_list") or ()
            group = getattr(ops[0], "group", None) if ops else None
        root = next((bound[n] for n in root_names if bound.get(n) is not None), None)
        ro = bound.get("op") if op != "batch_isend_irecv" else None
        async_op = bool(bound.get("async_op")) or (op.startswith("i") and op in P2P)
        return group, bound.get(described), ro, root, async_op

    return extract


def _wrap(op: str, fn):
    extract = _extractor(op, fn)

    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        if getattr(_tls, "depth", 0) or _S.trace_dir is None:
            return fn(*args, **kwargs)  # nested inside a recorded call: one event per user call
        token = 0
        try:
            group, tensors, ro, root, async_op = extract(args, kwargs)
            token = record_collective(op, group, tensors, reduce_op=ro, root=root, async_op=async_op,
                                      frame=sys._getframe(1))
        except Exception as exc:  # never break the program
            _note_failure(exc)
        _tls.depth = 1
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            record_complete(token, ok=False, error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            _tls.depth = 0
        record_complete(token)
        return result

    recorded.__hctool_original__ = fn
    return recorded


def _safe_write(rec: dict) -> None:
    try:
        _write(rec)
    except Exception as exc:
        _note_failure(exc)


_failed_once = False


def _note_failure(exc: Exception) -> None:
    global _failed_once
    if not _failed_once:
        _failed_once = True
        sys.stderr.write(f"hctool: recorder error (recording continues where possible): {type(exc).__name__}: {exc}\n")


def _wrap_group_creation(name: str, fn):
    @functools.wraps(fn)
    def created(*args, **kwargs):
        depth = getattr(_tls, "depth", 0)
        _tls.depth = 1  # collectives torch issues while creating a group are not user calls
        try:
            result = fn(*args, **kwargs)
        finally:
            _tls.depth = depth
        try:
            if name == "init_process_group":
                from hctool.consensus import capture_c10d  # C++-issued and functional collectives

                capture_c10d.install()  # here, not at import: torch is fully imported by now
                _S.next_group_idx = 1
                _register_default_group()
            else:
                ranks = kwargs.get("ranks", args[0] if args else None)
                ranks = sorted(ranks) if ranks is not None else list(range(_dist.get_world_size()))
                idx = _S.next_group_idx
                _S.next_group_idx += 1
                key = f"{idx}:" + json.dumps(ranks, separators=(",", ":"))
                if result is not None and result is not _dist.GroupMember.NON_GROUP_MEMBER:
                    _S.groups[id(result)] = (result, key, ranks)
                if _S.rank is None or _S.rank in ranks or _S.fd is not None:
                    _write({"grp": key, "idx": idx, "ranks": ranks})
        except Exception as exc:
            _note_failure(exc)
        return result

    created.__hctool_original__ = fn
    return created


def _wrap_destroy(fn):
    """destroy_process_group() of the default group: this rank issues no more
    collectives, so it counts as ended clean even if it then hangs in the
    teardown (NCCL) or exits late (the analyzer reads an `end` record)."""
    @functools.wraps(fn)
    def destroy(group=None, *args, **kwargs):
        if group is None and _S.fd is not None:
            _safe_write({"end": 1, "t": time.monotonic(), "destroy": 1})
        return fn(group, *args, **kwargs)

    destroy.__hctool_original__ = fn
    return destroy


# ---------------------------------------------------------------- labelled events

def record_label(label: str, value, depth: int = 2) -> None:
    if _S.trace_dir is None:
        return
    try:
        digest = hashlib.sha1(_canonical(value)).hexdigest()[:16]
        site, func, stack = _call_site(sys._getframe(depth))
        text = repr(value)
        _write({"e": next(_S.ids), "g": "labels", "s": _S.seq.setdefault("labels", 0), "op": "assert_same",
                "label": str(label), "digest": digest, "value": text[:80], "st": "c", "site": site,
                "fn": func, "stack": stack, "th": threading.current_thread().name,
                "t": time.monotonic(), "w": time.time()})
        _S.seq["labels"] += 1
    except Exception as exc:
        _note_failure(exc)


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


# ---------------------------------------------------------------- installing

def patch_torch_distributed() -> None:
    global _dist, _INTERNAL
    import torch.distributed as dist

    if not dist.is_available() or getattr(dist, "__hctool_patched__", False):
        return
    _dist = dist
    torch_dir = os.path.dirname(os.path.dirname(os.path.abspath(dist.__file__))) + os.sep
    _INTERNAL = (_HCTOOL_DIR, torch_dir)
    c10d = dist.distributed_c10d
    for op in COLLECTIVES + tuple(P2P) + ("batch_isend_irecv",):
        fn = getattr(c10d, op, None)
        if fn is None:
            continue
        wrapped = _wrap(op, fn)
        setattr(c10d, op, wrapped)
        if getattr(dist, op, None) is fn:
            setattr(dist, op, wrapped)
    for name in ("init_process_group", "new_group"):
        fn = getattr(c10d, name)
        wrapped = _wrap_group_creation(name, fn)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)
    fn = c10d.destroy_process_group
    wrapped = _wrap_destroy(fn)
    c10d.destroy_process_group = wrapped
    if getattr(dist, "destroy_process_group", None) is fn:
        dist.destroy_process_group = wrapped
    dist.__hctool_patched__ = True


class _PatchOnImport:
    """Meta-path finder: lets torch.distributed load normally, then patches it."""

    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            try:
                patch_torch_distributed()
            except Exception as exc:
                sys.stderr.write(f"hctool: installing the collective recorder failed: {type(exc).__name__}: {exc}\n")

        loader.exec_module = exec_module
        return spec


def install_on_import(trace_dir: str) -> None:
    _S.trace_dir = os.path.abspath(trace_dir)
    sys.excepthook = _excepthook(sys.excepthook)
    if "torch.distributed" in sys.modules:
        patch_torch_distributed()
    else:
        sys.meta_path.insert(0, _PatchOnImport())

"""Seeing the collectives torch issues without the Python API (docs/consensus.md, "Coverage").

Pass-through layers, all recording through recorder.record_collective only when
the call is not already inside a recorded torch.distributed call (so a
collective is recorded once, by the outermost layer that sees it):

1. Dispatcher ops. Every ProcessGroup method (`pg.allreduce(...)`), from Python
   or from C++ (DDP's reducer and its start-up broadcast, parameter
   verification), calls a `c10d::*` op through the dispatcher. Those ops only
   have backend kernels (CPU, CUDA); a Python kernel registered at the Autograd
   key runs first, records, and redispatches past autograd to torch's own
   kernel. The torch.distributed wrappers issue their calls with the autograd
   keys excluded, so only C++-issued calls pay this kernel's boxing (tens of
   us). Where check-consensus built the C++ capture kernel (_c10d_kernel.cpp),
   that kernel sits at the Autograd key instead and calls this one, except for
   repeat calls on threads without Python frames during backward (DDP's bucket
   all-reduce on autograd's device thread), which it records itself from the
   ids this one offers. A compiled graph (torch.compile) issues `_c10d_functional` ops instead,
   which have their own autograd kernels: the same kind of kernel sits one key
   lower, at ADInplaceOrView; tracing runs (FakeTensor, FunctionalTensor
   inputs) are not calls and pass through. Calls made while these keys are
   excluded (inside another op's kernel, e.g. DTensor dispatch) skip layer 1:
2. Functional collectives (`torch.distributed._functional_collectives`):
   DTensor redistribution (clip_grad_norm_ on FSDP2's sharded grads, tensor
   parallel) calls them from inside __torch_dispatch__. Their module functions
   are wrapped (funcol.py); while torch.compile traces they pass through.

Completion: a c10d op's record completes when its Work's future is done (gloo:
the collective finished); on CUDA tensors, at return (NCCL marks its futures
done at enqueue; value() on a CUDA future would make the polling thread's
stream wait). gloo's Work.is_completed() is not
usable: it stays False for reduce_scatter_tensor even after wait(). Futures are
polled, not given callbacks: a callback makes another thread take the GIL once
per collective, which cost ~65 us a call on the 2-core box (most of this
route's cost). They are polled when the next call is recorded, by a watcher
thread every POLL_S, and at destroy_process_group and exit. Functional collectives complete
at return (they are waited on later, through wait_tensor).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from hctool.agent.capture import cxx_kernel, funcol, recorder, state, tracefile
from hctool.agent.clock import REAL

# dispatcher op -> (recorded op, contributed-tensors arg, group arg, reduce-op arg, root arg, peer?)
# The recorded name and described argument match what the Python wrapper records for the
# same call made through torch.distributed, so the two layers agree across ranks.
C10D_OPS = {
    "allreduce_": ("all_reduce", 0, 1, 2, None, False),
    "allreduce_coalesced_": ("all_reduce_coalesced", 0, 1, 2, None, False),
    "broadcast_": ("broadcast", 0, 1, None, 2, False),
    "reduce_": ("reduce", 0, 1, 2, 3, False),
    "allgather_": ("all_gather", 1, 2, None, None, False),
    "_allgather_base_": ("all_gather_into_tensor", 1, 2, None, None, False),
    "allgather_coalesced_": ("all_gather_coalesced", 1, 2, None, None, False),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", 1, 2, None, None, False),
    "reduce_scatter_": ("reduce_scatter", 0, 2, 3, None, False),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", 1, 2, 3, None, False),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", 1, 2, 3, None, False),
    "gather_": ("gather", 1, 2, None, 3, False),
    "scatter_": ("scatter", 0, 2, None, 3, False),
    "alltoall_": ("all_to_all", 1, 2, None, None, False),
    "alltoall_base_": ("all_to_all_single", 1, 2, None, None, False),
    "barrier": ("barrier", None, 1, None, None, False),
    "send": ("send", 0, 1, None, 2, True),
    "recv_": ("recv", 0, 1, None, 2, True),
}
# _c10d_functional op -> (recorded op, contributed-tensors arg). What a compiled graph runs
# (dynamo turns dist.* calls into these); the group is always the `group_name` argument.
FUNCTIONAL_OPS = {
    "all_reduce": ("all_reduce", 0),
    "all_reduce_": ("all_reduce", 0),
    "all_reduce_coalesced": ("all_reduce_coalesced", 0),
    "all_reduce_coalesced_": ("all_reduce_coalesced", 0),
    "all_gather_into_tensor": ("all_gather_into_tensor", 0),
    "all_gather_into_tensor_out": ("all_gather_into_tensor", 0),
    "all_gather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", 0),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", 0),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", 0),
    "all_to_all_single": ("all_to_all_single", 0),
    "broadcast": ("broadcast", 0),
    "broadcast_": ("broadcast", 0),
}

_libs: list = []  # torch.library registrations live as long as these objects
_installed = False
_cxx = None  # the C++ capture kernel's module (_c10d_kernel.cpp), when built and loaded


def load_kernel() -> None:
    """Load the C++ capture kernel (cxx_kernel.py, built by hctool/consensus/kernel_build.py) if
    check-consensus built one: called by init_process_group before the default group is registered,
    so every sequence number and slot comes from its Counters (taken without the GIL by C++, atomically by Python)."""
    global _cxx
    if _cxx is not None:
        return  # a second init_process_group: loaded already

    module = cxx_kernel.load()
    if module is None:
        return
    S = state.S
    with S.lock:  # no group exists yet, so only the slot counter predates this
        state.new_counter = module.Counter
        S.slots = module.Counter(cxx_kernel.counter_value(S.slots))
    module.bind(tracefile._grow, lambda token, message: recorder.record_complete(token, ok=False, error=message))
    state.on_reset.append(module.invalidate)
    S.c10d_kernel = "c++"
    _cxx = module


def set_backward_site(site: int) -> int:
    """Publish the site of the main thread's backward call in progress (0: none); returns the
    previous one. Both kernels attribute frameless threads' calls to it."""
    prev, state.S.backward_site = state.S.backward_site, site
    if _cxx is not None:
        _cxx.set_backward_site(site)
    return prev


def cxx_stats() -> dict | None:
    """Calls the C++ kernel recorded itself / handed to the Python kernel (None: not loaded)."""
    return None if _cxx is None else dict(_cxx.stats())


def _redispatch_once(packet, keyset, args, kwargs, token: int):
    """Run torch's kernel as inside a recorded call: ops it issues through the
    dispatcher (inductor's in-place all_reduce_ calls all_reduce) are not recorded again.
    A kernel that raises completes the record as failed."""
    ident = threading.get_ident()
    state.inside.add(ident)
    try:
        return packet.redispatch(keyset, *args, **kwargs)
    except BaseException as exc:
        recorder.record_failed(token, exc)
        raise
    finally:
        state.inside.discard(ident)


def _work_of(result):
    """The Work a c10d op returned (alone or as the last item of a tuple), or None."""
    import torch.distributed as dist

    obj = result[-1] if isinstance(result, tuple) else result
    try:
        return dist.distributed_c10d.Work.unbox(obj)
    except Exception:
        return None


POLL_S = 0.02
_pending: list[tuple[int, object]] = []  # (token, Future) of C++-issued calls not yet done
_pending_lock = threading.Lock()
_has_pending = threading.Event()  # the watcher sleeps on it while nothing is pending
_watcher: threading.Thread | None = None


def _complete_on(work, token: int) -> None:
    global _watcher
    try:
        fut = work.get_future()
    except Exception:  # backends without futures: count the call done when it returns
        recorder.record_complete(token)
        return
    with _pending_lock:
        _pending.append((token, fut))
        if not _has_pending.is_set():
            _has_pending.set()
    poll_pending()
    if _watcher is None:
        _watcher = threading.Thread(target=_watch, name="hctool-work-watcher", daemon=True)
        _watcher.start()


def poll_pending() -> None:
    """Complete the records whose futures are done (any thread; one at a time)."""
    if not _pending or not _pending_lock.acquire(blocking=False):
        return
    try:
        done = []
        for item in _pending:
            try:
                if item[1].done():
                    done.append(item)
            except Exception:
                done.append(item)
        for item in done:
            _pending.remove(item)
    finally:
        _pending_lock.release()
    for token, fut in done:
        try:
            fut.value()  # done: raises if the collective failed, else returns at once (CPU tensors only)
        except Exception as exc:
            recorder.record_failed(token, exc)
            continue
        recorder.record_complete(token)


def _watch() -> None:
    while True:
        _has_pending.wait()
        REAL.sleep(POLL_S)  # not slowed by a thread-slow fault
        try:
            poll_pending()
        except Exception as exc:  # never let the watcher die silently
            recorder.note_failure(exc)
        with _pending_lock:
            if not _pending:
                _has_pending.clear()


def _after_fork_in_child() -> None:
    global _watcher, _pending_lock, _has_pending
    _pending.clear()  # the parent's Works: not this process's calls
    _pending_lock, _has_pending = threading.Lock(), threading.Event()
    _watcher = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _c10d_kernel(op_name: str, packet):
    import torch
    import torch.distributed as dist

    recorded, t_arg, g_arg, ro_arg, root_arg, p2p = C10D_OPS[op_name]
    below = torch._C._after_autograd_keyset
    red_names = {int(v): k for k, v in dist.ReduceOp.RedOpType.__members__.items()}

    def kernel(keyset, *args, **kwargs):
        if state.nested() or not recorder.enabled():
            return packet.redispatch(keyset & below, *args, **kwargs)
        token, on_gpu = 0, False
        try:
            group = dist.ProcessGroup.unbox(args[g_arg])
            ro = red_names.get(args[ro_arg].op()) if ro_arg is not None else None
            root = args[root_arg] if root_arg is not None else None
            if root is not None and root >= 0 and group is not dist.GroupMember.WORLD:
                root = dist.get_global_rank(group, root)  # the ops take group ranks; records hold global ones
            tensors = args[t_arg] if t_arg is not None else None
            if type(tensors) is list and len(tensors) == 1:
                tensors = tensors[0]  # described the same; the tensor takes the interning fast path
            first = tensors[0] if type(tensors) is list and tensors else tensors
            on_gpu = getattr(first, "is_cuda", False) is True
            # This frame, not its caller: on autograd's device threads (DDP's reducer on
            # CUDA) the kernel is the thread's only Python frame. The recorder skips
            # hctool's frames and falls back to the main thread's line.
            if state.S.before_call is not None:  # an in-rank fault (collective-delay)
                state.S.before_call(recorded, state.group_index(group))
            token = recorder.record_collective(
                recorded, group, tensors, reduce_op=ro, root=root, async_op=True, frame=sys._getframe()
            )
            if token and _cxx is not None:  # the C++ kernel may record the next such call itself
                g = state.S.groups.get(id(group))
                if g is not None:
                    _cxx.offer(token, g.seq, state.S.slots)
        except Exception as exc:
            recorder.note_failure(exc)
        result = _redispatch_once(packet, keyset & below, args, kwargs, token)
        if token:
            # CUDA tensors: complete at return, which is when NCCL marks the Work's future
            # done (enqueued), without the four pybind calls of unboxing and polling it.
            work = None if on_gpu else _work_of(result)
            if work is None:
                recorder.record_complete(token)
            else:
                _complete_on(work, token)
        return result

    return kernel


def _install_kernels(namespace: str, ops, make_kernel, key: str) -> None:
    """Register make_kernel(op, its default overload) at KEY for each of OPS in NAMESPACE."""
    import torch

    lib = torch.library.Library(namespace, "IMPL")
    for name in ops:
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is None or "default" not in packet.overloads():
            continue  # an op this torch version does not have
        lib.impl(name, make_kernel(name, packet.default), key, with_keyset=True)
    _libs.append(lib)


def _install_c10d() -> None:
    if _cxx is None:
        return _install_kernels("c10d", C10D_OPS, _c10d_kernel, "Autograd")
    import torch

    for name, (_, t_arg, g_arg, ro_arg, root_arg, _p2p) in C10D_OPS.items():
        packet = getattr(torch.ops.c10d, name, None)
        if packet is None or "default" not in packet.overloads():
            continue  # an op this torch version does not have
        _cxx.register(
            name,
            _c10d_kernel(name, packet.default),
            *(-1 if a is None else a for a in (t_arg, g_arg, ro_arg, root_arg)),
        )


def _functional_kernel(op_name: str, packet):
    """Layer 1 for `_c10d_functional` ops, which have their own autograd kernels: this one
    sits at ADInplaceOrView (just below autograd) and redispatches past it."""
    import torch
    import torch.distributed as dist

    recorded, t_arg = FUNCTIONAL_OPS[op_name]
    names = [a.name for a in packet._schema.arguments]
    g_arg = names.index("group_name")
    ro_arg = names.index("reduce_op") if "reduce_op" in names else None
    root_arg = names.index("src") if "src" in names else None
    below = torch._C._after_ADInplaceOrView_keyset
    Tensor = torch.Tensor

    def kernel(keyset, *args, **kwargs):
        first = args[t_arg][0] if isinstance(args[t_arg], (list, tuple)) and args[t_arg] else args[t_arg]
        # torch.compile traces the graph with FakeTensor / FunctionalTensor inputs: not a real call
        if state.nested() or not recorder.enabled() or type(first) is not Tensor:
            return packet.redispatch(keyset & below, *args, **kwargs)
        token = 0
        try:
            pg = dist.distributed_c10d._resolve_process_group(
                args[g_arg] if g_arg < len(args) else kwargs["group_name"]
            )
            ro = args[ro_arg] if ro_arg is not None and ro_arg < len(args) else None
            token = recorder.record_collective(
                recorded,
                pg,
                args[t_arg],
                reduce_op=str(ro).upper() if ro else None,
                root=args[root_arg] if root_arg is not None else None,
                async_op=True,
                frame=sys._getframe(),
            )
        except Exception as exc:
            recorder.note_failure(exc)
        result = _redispatch_once(packet, keyset & below, args, kwargs, token)
        recorder.record_complete(token)  # issued; wait_tensor waits for it, as for functional collectives
        return result

    return kernel


def _install_functional() -> None:
    _install_kernels("_c10d_functional", FUNCTIONAL_OPS, _functional_kernel, "ADInplaceOrView")


def install() -> None:
    """Called once by recorder.patch_torch_distributed; each layer that fails to
    install says so on stderr and the rest goes on."""
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(poll_pending)  # registered after the end record's handler, so it runs before it

    for layer in (_install_c10d, _install_functional, funcol.install_funcol):
        try:
            layer()
        except Exception as exc:
            sys.stderr.write(
                f"hctool: capturing C++-issued collectives ({layer.__name__}) failed: {type(exc).__name__}: {exc}\n"
            )

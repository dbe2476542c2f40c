"""The Python capture route: wraps the public collectives, p2p calls,
batch_isend_irecv and object collectives of torch.distributed (and
distributed_c10d), and the group constructors. Each wrapper calls
recorder.record_collective / record_complete; calls torch makes inside a
recorded call (the broadcasts of broadcast_object_list) are not recorded again.
At init_process_group it loads and installs the dispatcher-level routes (c10d.py).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import tempfile
import threading

from hctool.agent.capture import c10d, recorder, state, tracefile
from hctool.agent.capture.state import inside as _inside
from hctool.agent.clock import REAL
from hctool.protocol import env as protocol_env

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
)
P2P = recorder.P2P
# The argument that describes what a rank contributes (default: the first parameter).
_DESCRIBED_ARG = {
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "reduce_scatter_tensor": "input",
    "all_to_all_single": "input",
    "all_to_all": "input_tensor_list",
    "all_gather_object": "object_list",
    "gather_object": "obj",
    "scatter_object_list": "scatter_object_output_list",
    "batch_isend_irecv": "p2p_op_list",
    "barrier": None,
    "monitored_barrier": None,
}
_ROOT_ARGS = ("src", "dst", "group_src", "group_dst")
_P2P_PEER_ARGS = ("dst", "src", "group_dst", "group_src")


def _extractor(op: str, fn):
    """A function with fn's own signature returning (group, tensors, reduce_op,
    root, async_op): Python binds the arguments at C speed, defaults included."""
    params = list(inspect.signature(fn).parameters.values())
    names = {p.name for p in params}
    ns: dict = {}
    text, star = [], False
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            text.append("*" + p.name)
            star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            text.append("**" + p.name)
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            text.append("*")
            star = True
        if p.default is not p.empty:
            ns[f"_d{i}"] = p.default
            text.append(f"{p.name}=_d{i}")
        else:
            text.append(p.name)
    described = _DESCRIBED_ARG.get(op, params[0].name if params else None)
    roots = [n for n in (_P2P_PEER_ARGS if op in P2P else _ROOT_ARGS) if n in names]
    root = "None"
    for n in reversed(roots):
        root = f"({n} if {n} is not None else {root})"
    group = "group" if "group" in names else "None"
    if op == "batch_isend_irecv":
        group = "(p2p_op_list[0].group if p2p_op_list else None)"
    ro = "op" if "op" in names and op != "batch_isend_irecv" else "None"
    is_async = "True" if op in ("isend", "irecv") else ("async_op" if "async_op" in names else "False")
    src = (
        f"def extract({', '.join(text)}):\n"
        f"    return {group}, {described if described in names else 'None'}, {ro}, {root}, {is_async}\n"
    )
    exec(src, ns)  # noqa: S102 - source built from torch's own signature
    return ns["extract"]


# One reusable guard per thread that excludes the autograd dispatch keys (what
# at::AutoDispatchBelowAutograd does; its Python binding acts at construction
# only, so it cannot be reused). A guard holds its state between __enter__ and
# __exit__, and a thread never enters its own twice (nested calls skip it).
_below_autograd_guards: dict[int, object] = {}


def _autograd_keys():
    from torch._C import DispatchKey, DispatchKeySet

    return (
        DispatchKeySet(DispatchKey.AutogradFunctionality)
        | DispatchKeySet(DispatchKey.AutogradOther)
        | DispatchKeySet(DispatchKey.AutogradNestedTensor)
    )


def _new_guard(ident: int):
    from torch._C import _ExcludeDispatchKeyGuard

    guard = _below_autograd_guards[ident] = _ExcludeDispatchKeyGuard(_autograd_keys())
    return guard


def _bind_dispatch_tls(torch) -> bool:
    """Let the C hooks go below autograd by writing c10's thread-local dispatch key
    set themselves (the pybind guard costs ~2,000 instructions a call). Kept only if,
    on this thread, it leaves exactly the excluded set the guard leaves, and undoes it."""
    from torch._C import DispatchKey, _ExcludeDispatchKeyGuard
    from torch._C import _dispatch_tls_is_dispatch_key_excluded as is_excluded
    from torch._C import _dispatch_tls_local_exclude_set as exclude_set

    fp = _fastpath
    keys = _autograd_keys().raw_repr()
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    try:
        if not fp.set_dispatch_tls(path, keys, 0):
            return False
        fp.set_dispatch_tls(path, keys, fp.excluded_raw() ^ exclude_set().raw_repr())

        def seen():
            return exclude_set().raw_repr(), is_excluded(DispatchKey.AutogradFunctionality)

        before = seen()
        with _ExcludeDispatchKeyGuard(_autograd_keys()):
            expected = seen()
        if expected[1] and not before[1] and fp.below_autograd(seen) == expected and seen() == before:
            return True
    except Exception as exc:
        recorder.note_failure(exc)
    fp.set_dispatch_tls(None, 0, 0)
    return False


def _is_compiling() -> bool:
    # torch.compiler is looked up per call until init_process_group binds it
    # (torch is still being imported when the wrappers are made)
    import torch

    return torch.compiler.is_compiling()


def _wrap(op: str, fn):
    """torch's `fn`, recorded. The wrapper dynamo inlines is Python (it swaps
    torch's function for a functional collective while tracing); the recorded
    call itself is the C hot path (_fastpath.c) where it is built, else
    _recorded_call, which also serves every case the C path hands back."""
    slow = _recorded_call(op, fn)
    hook = _fast_hook(op, fn, slow) or slow

    @functools.wraps(fn)
    def recorded(*args, **kwargs):
        if _is_compiling():  # dynamo sees torch's function
            return fn(*args, **kwargs)
        return hook(*args, **kwargs)

    recorded.__hctool_original__ = fn
    return recorded


def _recorded_call(op: str, fn):
    """A recorded call of fn, in Python. Called by the wrapper (directly or from
    the C hook), so the user's frame is two up."""
    extract = _extractor(op, fn)
    record, complete = recorder._record, recorder.record_complete
    S = state.S
    get_ident = threading.get_ident
    guards = _below_autograd_guards

    def recorded_call(*args, **kwargs):
        ident = get_ident()
        if S.trace_dir is None or ident in _inside:
            return fn(*args, **kwargs)  # nested inside a recorded call: one event per user call
        try:
            group, tensors, ro, root, async_op = extract(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # the call itself is wrong: torch says how
        if S.before_call is not None:  # an in-rank fault (collective-delay, cuda-sleep)
            S.before_call(op, state.group_index(group))
        token = record(op, group, tensors, ro, root, async_op, sys._getframe(2), ident)
        _inside.add(ident)
        try:
            # Below autograd, the c10d op goes straight to its backend kernel: the capture
            # kernel c10d.py puts at the Autograd key (~50 us of boxing and
            # redispatch) is for C++-issued calls only; this call is recorded already.
            with guards.get(ident) or _new_guard(ident):
                result = fn(*args, **kwargs)
        except BaseException as exc:
            recorder.record_failed(token, exc)
            raise
        finally:
            _inside.discard(ident)
        complete(token)
        return result

    return recorded_call


_MISSING = object()  # a parameter without a default (for the C hook)


def _fast_hook(op: str, fn, slow):
    """The C hook for fn, or None (the C module is not built, it is turned off
    with HCTOOL_FASTPATH=0, or fn's signature is one it does not bind)."""
    if _fastpath is None or op == "batch_isend_irecv":
        return None
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    plain = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    if len(params) > 32 or any(p.kind not in plain for p in params):
        return None
    names = tuple(p.name for p in params)
    index = {n: i for i, n in enumerate(names)}
    described = _DESCRIBED_ARG.get(op, names[0] if names else None)
    roots = tuple(index[n] for n in (_P2P_PEER_ARGS if op in P2P else _ROOT_ARGS) if n in index)[:4]
    async_const = op in ("isend", "irecv")
    return _fastpath.hook(
        op,
        fn,
        slow,
        names,
        sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params),
        tuple(_MISSING if p.default is p.empty else p.default for p in params),
        index.get("group", -1),
        index.get(described, -1) if described else -1,
        index.get("op", -1),
        -1 if async_const else index.get("async_op", -1),
        async_const,
        roots,
    )


def _load_fastpath():
    if os.environ.get(protocol_env.FASTPATH, "1") == "0":
        return None
    try:
        from hctool.agent.capture import _fastpath as module
    except ImportError:  # not built (no compiler at install) or built for another Python
        return None
    module.bind(
        state.S,
        _inside,
        _below_autograd_guards,
        _new_guard,
        tracefile._grow,
        recorder.record_failed,
        _MISSING,
        recorder._void,
    )
    state.S.fastpath = "c"
    return module


_fastpath = _load_fastpath()


def _wrap_group_creation(name: str, fn):
    @functools.wraps(fn)
    def created(*args, **kwargs):
        ident = threading.get_ident()
        nested = ident in _inside
        event = 0
        if name == "new_group" and not nested and not kwargs.get("use_local_synchronization"):
            # every rank must create every group, in one order: the "groups" sequence is compared
            # like a group's calls, so a rank that creates another group, or in another order, is
            # named even when no rank reaches a collective on it
            event = recorder.record_group_creation(kwargs.get("ranks", args[0] if args else None), sys._getframe(1))
        _inside.add(ident)  # collectives torch issues while creating a group are not user calls
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            recorder.record_group_created(event, ok=False)
            raise
        finally:
            if not nested:
                _inside.discard(ident)
        recorder.record_group_created(event)
        if state.S.trace_dir is None:
            return result
        try:
            dist = state.S.dist
            if name == "init_process_group":
                global _is_compiling
                import torch

                _is_compiling = torch.compiler.is_compiling  # torch is fully imported by now
                if _fastpath is not None:
                    state.S.fastpath = "c+tls" if _bind_dispatch_tls(torch) else "c"
                c10d.load_kernel()  # before the first group: its counters are the C++ kernel's
                _patch_backward()
                pg = dist.distributed_c10d._get_default_group()
                tracefile.register_group(pg, list(range(dist.get_world_size())), default=True)
                # C++-issued and functional collectives; here, not at import: torch is fully imported by now
                c10d.install()
            else:
                ranks = kwargs.get("ranks", args[0] if args else None)
                ranks = list(ranks) if ranks is not None else list(range(dist.get_world_size()))
                member = result is not None and result is not dist.GroupMember.NON_GROUP_MEMBER
                tracefile.register_group(result if member else None, ranks)
        except Exception as exc:
            tracefile.note_failure(exc)
        return result

    created.__hctool_original__ = fn
    return created


def patch_torch_distributed() -> None:
    import torch.distributed as dist

    if not dist.is_available() or getattr(dist, "__hctool_patched__", False):
        return
    state.S.dist = dist
    torch_dir = os.path.dirname(os.path.dirname(os.path.abspath(dist.__file__))) + os.sep
    # Generated code is not the user's line either: FX graphs (aot_eager) and inductor's modules.
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "torchinductor_")
    state.S.internal = (state.HCTOOL_DIR, torch_dir, "<frozen", "<eval_with_key", inductor)
    module = dist.distributed_c10d
    for op in COLLECTIVES + tuple(P2P) + ("batch_isend_irecv",):
        fn = getattr(module, op, None)
        if fn is not None:
            _install(dist, module, op, fn, _wrap(op, fn))
    for name in ("init_process_group", "new_group"):
        fn = getattr(module, name)
        _install(dist, module, name, fn, _wrap_group_creation(name, fn))
    _install(
        dist, module, "destroy_process_group", module.destroy_process_group, _wrap_destroy(module.destroy_process_group)
    )
    dist.__hctool_patched__ = True


def _patch_backward() -> None:
    """Publish the user's line of a backward call on the main thread while it runs: the line
    that C++-issued collectives on threads without Python frames (DDP's reducer on autograd's
    device thread) are attributed to. Both backward() and grad() run through this function."""
    import torch.autograd
    import torch.autograd.graph as graph

    fn = getattr(graph, "_engine_run_backward", None)
    if fn is None or getattr(fn, "__hctool_original__", None) is not None:
        return
    S = state.S

    @functools.wraps(fn)
    def run_backward(*args, **kwargs):
        # compiling first: dynamo, tracing this, then reads a constant, not threading's calls
        if (
            _is_compiling()
            or S.world is None
            or S.trace_dir is None
            or threading.get_ident() != threading.main_thread().ident
        ):
            return fn(*args, **kwargs)
        try:
            prev = c10d.set_backward_site(recorder.site_of(sys._getframe(1)))
        except Exception as exc:
            tracefile.note_failure(exc)
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            c10d.set_backward_site(prev)

    run_backward.__hctool_original__ = fn
    graph._engine_run_backward = run_backward
    if getattr(torch.autograd, "_engine_run_backward", None) is fn:
        torch.autograd._engine_run_backward = run_backward


def _wrap_destroy(fn):
    """destroy_process_group() of the default group: this rank issues no more
    collectives, so it counts as ended clean even if it then hangs in the
    teardown (NCCL) or exits late (the analyzer reads the `end` record)."""

    @functools.wraps(fn)
    def destroy(group=None, *args, **kwargs):
        if group is None and state.S.fd is not None:
            try:
                c10d.poll_pending()  # C++-issued calls that have finished complete before the end
                tracefile._side({"end": 1, "t": REAL.monotonic(), "destroy": 1})
            except Exception as exc:
                tracefile.note_failure(exc)
        return fn(group, *args, **kwargs)

    destroy.__hctool_original__ = fn
    return destroy


def _install(dist, module, name: str, fn, wrapped) -> None:
    setattr(module, name, wrapped)
    if getattr(dist, name, None) is fn:
        setattr(dist, name, wrapped)

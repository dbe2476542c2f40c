"""Layer 3 of the capture (docs/consensus.md, "Coverage"): the module functions of
torch.distributed._functional_collectives. DTensor redistribution (clip_grad_norm_
on FSDP2's sharded grads, tensor parallel) calls them from inside
__torch_dispatch__, where the dispatcher kernels of c10d.py are bypassed.
While torch.compile traces they pass through untouched; they complete at return
(the result is waited on later, through wait_tensor).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading

from hctool.agent.capture import recorder, state

# functional collective -> recorded op (named like the torch.distributed call it mirrors)
FUNCOL_OPS = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "broadcast": "broadcast",
    "all_gather_tensor": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "all_gather_tensor_autograd": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all_single",
    "all_to_all_single_autograd": "all_to_all_single",
    "permute_tensor": "permute_tensor",
}


def _funcol_wrapper(recorded: str, fn):
    import torch
    import torch.distributed as dist

    sig = inspect.signature(fn)
    names = list(sig.parameters)
    t_name = names[0]
    ro_name = "reduceOp" if "reduceOp" in names else None
    root_name = "src" if "src" in names else None
    from torch.distributed import _functional_collectives as funcol

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if torch.compiler.is_compiling():  # first: dynamo must trace through to torch's function
            return fn(*args, **kwargs)
        if state.nested() or not recorder.enabled():
            return fn(*args, **kwargs)
        token = 0
        try:
            bound = dict(zip(names, args), **kwargs)
            group = bound.get("group")
            name = funcol._resolve_group_name(group, bound.get("tag", ""))
            pg = dist.distributed_c10d._resolve_process_group(name)
            ro = bound.get(ro_name) if ro_name else None
            token = recorder.record_collective(
                recorded,
                pg,
                bound.get(t_name),
                reduce_op=str(ro).upper() if ro else None,
                root=bound.get(root_name) if root_name else None,
                async_op=True,
                frame=sys._getframe(),
            )
        except Exception as exc:
            recorder.note_failure(exc)
        ident = threading.get_ident()
        state.inside.add(ident)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            recorder.record_failed(token, exc)
            raise
        finally:
            state.inside.discard(ident)
        recorder.record_complete(token)
        return result

    wrapped.__hctool_original__ = fn
    return wrapped


def install_funcol() -> None:
    from torch.distributed import _functional_collectives as funcol

    for name, recorded in FUNCOL_OPS.items():
        fn = getattr(funcol, name, None)
        if fn is not None and not hasattr(fn, "__hctool_original__"):
            setattr(funcol, name, _funcol_wrapper(recorded, fn))

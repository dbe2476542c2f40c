# EXPECT: verdict=consistent
# SOURCE: NVIDIA/Megatron-LM megatron/core/pipeline_parallel/p2p_communication.py (_batched_p2p_ops, send_forward_recv_backward / send_backward_recv_forward); FlagOpen/FlagScale ascend/patches/adaptor_p2p_communication.py
# SHAPE: in the 1F1B steady state both stages post an isend AND an irecv to each other in the same batch_isend_irecv call (activations go 0->1 while gradients go 1->0), which looks like crossing sends that could deadlock, but the ops are non-blocking and each send has a matching recv in the peer's batch.
# RUN: torchrun --standalone --nproc-per-node 2 a15_1f1b_batch_isend_irecv.py
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed import P2POp, batch_isend_irecv, irecv, isend

M, B, D = 4, 3, 8  # micro-batches, micro-batch size, hidden size


def run_ops(ops):
    for req in batch_isend_irecv(ops):
        req.wait()


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
stage0, stage1 = torch.nn.Linear(D, D), torch.nn.Linear(D, 1)  # same init on both ranks
xs = [torch.randn(B, D) for _ in range(M)]

if rank == 0:
    outs = [stage0(xs[0])]
    run_ops([P2POp(isend, outs[0].detach(), 1)])  # warm-up forward
    for i in range(M):
        grad = torch.empty(B, D)
        ops = [P2POp(irecv, grad, 1)]
        if i + 1 < M:
            outs.append(stage0(xs[i + 1]))
            ops.insert(0, P2POp(isend, outs[i + 1].detach(), 1))  # send fwd + recv bwd together
        run_ops(ops)
        outs[i].backward(grad)
    mine = stage0.weight.grad
else:
    act = torch.empty(B, D)
    run_ops([P2POp(irecv, act, 0)])
    for i in range(M):
        act.requires_grad_(True)
        stage1(act).pow(2).sum().backward()
        ops = [P2POp(isend, act.grad.clone(), 0)]
        nxt = torch.empty(B, D)
        if i + 1 < M:
            ops.append(P2POp(irecv, nxt, 0))  # send bwd + recv next fwd together
        run_ops(ops)
        act = nxt
    mine = stage1.weight.grad

# reference: the same model run unpipelined on this rank
ref0, ref1 = torch.nn.Linear(D, D), torch.nn.Linear(D, 1)
ref0.load_state_dict(stage0.state_dict()); ref1.load_state_dict(stage1.state_dict())
sum(ref1(ref0(x)).pow(2).sum() for x in xs).backward()
ref = ref0.weight.grad if rank == 0 else ref1.weight.grad
assert torch.allclose(mine, ref, atol=1e-5), (mine - ref).abs().max()
print(f"rank {rank}: 1F1B grads match the unpipelined reference: OK", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)

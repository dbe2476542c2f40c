# EXPECT: verdict=diverged culprit=2 line=27
# KIND: extra
# SOURCE: https://github.com/OPM/opm-simulators/pull/7190
# SHAPE: 4 ranks, 200 steps: rank 2 alone detects a local gradient overflow at step 110 and re-reduces its clipped gradient with a same-shape all_reduce, which silently pairs with the other ranks' next step; the job only hangs at the final barrier. Run with --nproc-per-node 4.
import datetime

import torch
import torch.distributed as dist

STEPS = 200
OVERFLOW = 0.9995


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(40 + rank)
    scale = torch.rand(STEPS, generator=g)  # per-rank local gradient scale
    weights = torch.zeros(4)
    for step in range(STEPS):
        grad = torch.full((4,), float(scale[step]))
        dist.all_reduce(grad)
        if scale[step] > OVERFLOW:
            # BUG: overflow is detected from the local scale only (rank 2 at
            # step 110); re-reducing here is a collective no other rank joins.
            grad.clamp_(max=1.0)
            dist.all_reduce(grad)
            print(f"[rank{rank}] step {step}: local overflow, re-reduced", flush=True)
        weights -= 0.001 * grad / world
        if step % 40 == 0 or step > 105 and step < 113:
            print(f"[rank{rank}] step {step}: grad[0] {grad[0].item():.4f}", flush=True)
    dist.barrier()
    print(f"[rank{rank}] final w0 {weights[0].item():.5f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

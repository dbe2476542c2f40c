# EXPECT: verdict=diverged culprit=5 line=27
# KIND: missing
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/issues/5243
# SHAPE: 8 ranks, 200 steps: rank 5's local batch at step 169 is empty after filtering and it `continue`s past the step's all_reduce; the other seven ranks' remaining all_reduces pair one step off and they hang when rank 5 reaches the final barrier. Run with --nproc-per-node 8.
import datetime

import torch
import torch.distributed as dist

STEPS = 200
MIN_SCORE = 3e-4


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(40 + rank)
    quality = torch.rand(STEPS, generator=g)  # per-rank sample quality scores
    total = 0.0
    for step in range(STEPS):
        if quality[step] < MIN_SCORE:
            # BUG: rank-local filter (rank 5 at step 169) skips the step, and
            # with it the all_reduce below that the other ranks still issue.
            print(f"[rank{rank}] step {step}: batch filtered out, skipping", flush=True)
            continue
        loss = torch.tensor([float(quality[step]), float(step)])
        dist.all_reduce(loss)
        total += loss[0].item()
        if step % 50 == 0 or step > 166 and step < 172:
            print(f"[rank{rank}] step {step}: summed step ids {loss[1].item():.0f}", flush=True)
    dist.barrier()
    print(f"[rank{rank}] total {total:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

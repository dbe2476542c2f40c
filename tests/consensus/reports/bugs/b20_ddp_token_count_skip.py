# EXPECT: verdict=diverged culprit=1 line=39
# KIND: missing
# SOURCE: https://github.com/Project-MONAI/monai-physio/pull/137
# SHAPE: DDP training where each step first all_reduces the global token count (for loss normalisation) and then all_reduces gradients in backward; rank 1 gets a batch that is all padding at step 2 and `continue`s, skipping both collectives, so the rest of the run pairs one step off and the final barrier hangs.
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

PAD = 0


def get_batch(rank, step):
    g = torch.Generator().manual_seed(step * 10 + rank)
    tokens = torch.randint(1, 20, (2, 6), generator=g)
    tokens[:, 6 - (step + 2 * rank) % 4:] = PAD  # right padding varies per batch
    if rank == 1 and step == 2:
        tokens.fill_(PAD)  # rank 1's packer emitted an all-padding batch
    return tokens


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 20)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        tokens = get_batch(rank, step)
        n_local = (tokens != PAD).sum()
        if n_local == 0:
            # BUG: a rank-local "nothing to train on" skip; the other rank
            # still runs the token-count all_reduce and DDP's gradient sync.
            print(f"[rank{rank}] step {step}: empty batch, skipping", flush=True)
            continue
        n_tokens = n_local.reshape(1).float()
        dist.all_reduce(n_tokens)
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.view(-1, 20), tokens.view(-1),
                                           ignore_index=PAD, reduction="sum") / n_tokens
        opt.zero_grad()
        loss.backward()  # DDP gradient all_reduce
        opt.step()
        print(f"[rank{rank}] step {step}: local tokens {n_local.item()} global {n_tokens.item():.0f}",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

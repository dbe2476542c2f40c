# EXPECT: verdict=diverged culprit=0 line=15
# NPROC: 2
# SOURCE: https://github.com/pytorch/pytorch/pull/124268
# SHAPE: An evaluator lazily creates its process group through a cached property the first time it is used, and only rank 0 runs evaluation, so new_group is called on rank 0 alone.
import datetime
import functools

import torch
import torch.distributed as dist


class Evaluator:
    @functools.cached_property
    def group(self):
        return dist.new_group(list(range(dist.get_world_size())))  # BUG: first touched inside a rank-0 branch

    def evaluate(self, preds):
        t = preds.clone()
        dist.all_reduce(t, group=self.group)
        return t


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    evaluator = Evaluator()
    for step in range(2):
        grad = torch.full((3,), float(rank + step))
        dist.all_reduce(grad)
    if rank == 0:
        print("eval:", evaluator.evaluate(torch.ones(3)).tolist())
    final = torch.ones(1)
    dist.all_reduce(final)
    print(f"[rank{rank}] final={final.item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

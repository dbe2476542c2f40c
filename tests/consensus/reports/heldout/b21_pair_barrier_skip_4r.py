# EXPECT: verdict=diverged culprit=3 line=20
# NPROC: 4
# SOURCE: https://github.com/pytorch/pytorch/issues/130102
# SHAPE: Ranks are split into pair subgroups {0,1} and {2,3}; after writing a shard each pair barriers on its subgroup, but rank 3 skips the barrier when its shard is unchanged, leaving rank 2 stuck.
import datetime

import torch
import torch.distributed as dist


class ShardWriter:
    def __init__(self, rank, pair_group):
        self.rank, self.group = rank, pair_group
        self.last = None

    def flush(self, shard):
        dirty = self.last is None or not torch.equal(shard, self.last)
        if dirty:
            self.last = shard.clone()
            dist.barrier(group=self.group)  # BUG: only ranks with new data sync with their pair
        return dirty


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    writer = ShardWriter(rank, groups[rank // 2])
    for epoch in range(3):
        update = torch.ones(4) * (0 if (rank == 3 and epoch > 0) else epoch + 1)
        shard = (writer.last if writer.last is not None else torch.zeros(4)) + update
        wrote = writer.flush(shard)
        total = torch.tensor([float(wrote)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: {int(total.item())} ranks wrote shards")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

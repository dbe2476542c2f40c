# EXPECT: verdict=diverged culprit=0 line=20
# KIND: extra
# SOURCE: https://github.com/pytorch/pytorch/issues/81291
# SHAPE: rank 0 creates a private logging subgroup with dist.new_group([0]) that rank 1 never creates; new_group must be called by every rank in the same order, so the later data-parallel group gets a different identity on each rank and the job hangs.
import datetime

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=60)


def main():
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank = dist.get_rank()
    log_group = None
    if rank == 0:
        # BUG: new_group is a collective over the whole world; only rank 0
        # calls it here.
        log_group = dist.new_group([0], timeout=TIMEOUT)
        print("[rank0] created logging group", flush=True)
    dp_group = dist.new_group([0, 1], timeout=TIMEOUT)
    print(f"[rank{rank}] created dp group", flush=True)
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t, group=dp_group)
    print(f"[rank{rank}] dp all_reduce {t.tolist()}", flush=True)
    if log_group is not None:
        dist.barrier(group=log_group)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

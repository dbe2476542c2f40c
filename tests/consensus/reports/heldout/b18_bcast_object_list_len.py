# EXPECT: verdict=diverged culprit=1 line=24
# NPROC: 2
# SOURCE: https://github.com/open-mmlab/mmrazor/pull/153
# SHAPE: Rank 0 broadcasts its list of eval prompts with broadcast_object_list, but rank 1 sizes its receive list from its own local prompt file, giving a different object count.
import datetime

import torch.distributed as dist

LOCAL_PROMPT_FILES = {0: ["a cat", "a dog"], 1: ["a cat", "a dog", "a bird"]}


def read_prompts(rank):
    return list(LOCAL_PROMPT_FILES[rank])


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    local = read_prompts(rank)
    if rank == 0:
        payload = local
    else:
        payload = [None] * len(local)  # BUG: should be sized from the source rank's count
    dist.broadcast_object_list(payload, src=0)
    print(f"[rank{rank}] prompts: {payload}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

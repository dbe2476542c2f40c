# EXPECT: verdict=diverged culprit=1 line=24
# KIND: shape
# SOURCE: https://github.com/PrincetonUniversity/FOCUS/pull/95
# SHAPE: receivers size their broadcast_object_list buffer from their own config; rank 1 has a stale local config without the "lr" key, so it passes a 2-slot list while rank 0 broadcasts 3 objects, and the size broadcast inside broadcast_object_list mismatches.
import datetime

import torch.distributed as dist

DEFAULTS = {"model": "tiny-mlp", "vocab": 128, "lr": 3e-4}


def local_config(rank):
    cfg = dict(DEFAULTS)
    if rank == 1:
        cfg.pop("lr")  # rank 1's node still has last week's config file
    return cfg


def sync_config(cfg, rank):
    keys = sorted(cfg)
    values = [cfg[k] for k in keys] if rank == 0 else [None] * len(keys)
    # BUG: on rank 1 the list length comes from its own (stale) config, not
    # from rank 0, so it does not match the 3 objects rank 0 sends.
    dist.broadcast_object_list(values, src=0)
    return dict(zip(keys, values))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    cfg = sync_config(local_config(rank), rank)
    print(f"[rank{rank}] synced config {cfg}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

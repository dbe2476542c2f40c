# EXPECT: verdict=diverged culprit=0 line=23
# KIND: extra
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/issues/5493
# SHAPE: predictions are gathered with one all_gather_object per local prediction; rank 0 holds 3 predictions and rank 1 only 2, so rank 0's third all_gather_object has no partner and meets rank 1's barrier.
import datetime

import torch.distributed as dist


def predict(rank):
    # uneven eval shard: 5 samples over 2 ranks
    samples = list(range(5))[rank::2]
    return [{"id": s, "label": s % 3} for s in samples]


def gather_predictions(preds, world):
    gathered = []
    for p in preds:
        out = [None] * world
        # BUG: the loop length is the local number of predictions, which
        # differs across ranks, so the ranks issue different numbers of
        # all_gather_object calls.
        dist.all_gather_object(out, p)
        gathered.extend(out)
    return gathered


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    preds = predict(rank)
    print(f"[rank{rank}] {len(preds)} local predictions", flush=True)
    allp = gather_predictions(preds, world)
    print(f"[rank{rank}] gathered ids {[p['id'] for p in allp]}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

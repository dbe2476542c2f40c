# EXPECT: verdict=diverged culprit=0 line=24
# NPROC: 2
# SOURCE: https://github.com/kyutai-labs/pocket-tts/pull/277
# SHAPE: A watcher thread sets a preemption flag on the node that got SIGTERM (rank 0 only); that rank checkpoints with all_gather_object while the other keeps training.
import datetime
import threading
import time

import torch
import torch.distributed as dist

stop_requested = threading.Event()


def preemption_watcher(rank):
    # Simulates the scheduler delivering SIGTERM to one node only.
    if rank == 0:
        time.sleep(0.3)
        stop_requested.set()


def save_checkpoint(rank, step, weights):
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, {"rank": rank, "step": step, "w": weights.tolist()})
    if rank == 0:
        print(f"checkpoint at step {step}: {len(states)} shards")


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    threading.Thread(target=preemption_watcher, args=(rank,), daemon=True).start()
    w = torch.zeros(4)
    for step in range(10):
        g = torch.randn(4, generator=torch.Generator().manual_seed(step))
        dist.all_reduce(g)
        w -= 0.01 * g
        time.sleep(0.1)
        if stop_requested.is_set():
            # BUG: flag is local to the signalled rank; no all_reduce of the flag first
            save_checkpoint(rank, step, w)
            break
    print(f"[rank{rank}] leaving at step {step}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

# EXPECT: verdict=diverged culprit=0 line=39
# KIND: op
# SOURCE: https://github.com/NVIDIA/TensorRT-LLM/pull/13564
# SHAPE: a background prefetch thread sets a threading.Event when the next shard is downloaded; the main loop then broadcasts the new epoch length, but only rank 0's (fast) thread has finished, so rank 0's broadcast meets rank 1's per-step all_reduce and both hang.
import datetime
import threading
import time

import torch
import torch.distributed as dist


class ShardPrefetcher:
    def __init__(self, rank, download_s):
        self.rank = rank
        self.ready = threading.Event()
        self.next_shard = None
        threading.Thread(target=self._download, args=(download_s,), daemon=True).start()

    def _download(self, download_s):
        time.sleep(download_s)  # simulated remote read
        self.next_shard = list(range(100 + self.rank))
        self.ready.set()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    # rank 0's storage is fast, rank 1's is very slow
    prefetcher = ShardPrefetcher(rank, download_s=0.3 if rank == 0 else 120.0)
    swapped = False
    for step in range(15):
        time.sleep(0.1)  # training work
        if prefetcher.ready.is_set() and not swapped:
            swapped = True
            epoch_len = torch.tensor([len(prefetcher.next_shard)])
            # BUG: gated on this rank's own thread; rank 1's event is not set
            # yet, so only rank 0 enters the broadcast.
            dist.broadcast(epoch_len, src=0)
            print(f"[rank{rank}] new epoch length {epoch_len.item()}", flush=True)
        t = torch.tensor([float(step)])
        dist.all_reduce(t)
        print(f"[rank{rank}] step {step} reduced {t.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

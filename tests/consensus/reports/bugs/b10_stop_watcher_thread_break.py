# EXPECT: verdict=diverged culprit=1 line=43
# KIND: missing
# SOURCE: https://github.com/kyutai-labs/pocket-tts/pull/277
# SHAPE: a watcher thread sets a stop flag when this rank's node gets a preemption notice; rank 1's watcher fires after ~0.45 s and its loop breaks before the step's all_reduce, while rank 0 keeps training and waits forever.
import datetime
import threading
import time

import torch
import torch.distributed as dist


class PreemptionWatcher(threading.Thread):
    """Polls a (simulated) node-local maintenance notice and sets a flag."""

    def __init__(self, notice_after_s):
        super().__init__(daemon=True)
        self.stop_requested = threading.Event()
        self.notice_after_s = notice_after_s

    def run(self):
        time.sleep(self.notice_after_s)
        self.stop_requested.set()


class Trainer:
    def __init__(self, rank):
        self.rank = rank
        self.weights = torch.zeros(4)
        # only rank 1's node is being drained; rank 0's notice never comes in time
        self.watcher = PreemptionWatcher(0.45 if rank == 1 else 300.0)
        self.watcher.start()

    def fit(self, steps=30):
        for step in range(steps):
            if self.watcher.stop_requested.is_set():
                # BUG: the flag is local to this rank; rank 1 stops here and
                # never issues this step's all_reduce.
                print(f"[rank{self.rank}] stop requested at step {step}", flush=True)
                break
            time.sleep(0.1)
            grad = torch.full((4,), 1.0 + self.rank)
            dist.all_reduce(grad)
            self.weights -= 0.01 * grad
            print(f"[rank{self.rank}] step {step} w0 {self.weights[0].item():.3f}", flush=True)
        self.save()

    def save(self):
        gathered = [torch.zeros(4) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, self.weights)
        print(f"[rank{self.rank}] saved {[g[0].item() for g in gathered]}", flush=True)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    Trainer(dist.get_rank()).fit()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

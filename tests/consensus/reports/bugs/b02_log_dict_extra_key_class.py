# EXPECT: verdict=diverged culprit=0 line=18
# KIND: extra
# SOURCE: https://github.com/Lightning-AI/pytorch-lightning/issues/19106
# SHAPE: a MetricLogger syncs every key of a per-step metrics dict with all_reduce; rank 0 adds a "clip_events" key at one step from its local grad norm, so it issues one extra same-shape all_reduce that silently mis-pairs the keys (wrong means printed) and finally meets rank 1's 3-element summary all_reduce, where the job hangs.
import datetime

import torch
import torch.distributed as dist


class MetricLogger:
    def __init__(self):
        self.world = dist.get_world_size()
        self.history = {}

    def _sync(self, value):
        t = torch.tensor([float(value)])
        dist.all_reduce(t)
        return t.item() / self.world

    def log_dict(self, metrics):
        # One collective per key: ranks must log exactly the same keys.
        for key in sorted(metrics):
            self.history.setdefault(key, []).append(self._sync(metrics[key]))


def local_grad_norm(rank, step):
    # rank 0 hits one gradient spike at step 2 (deterministic)
    return 9.0 if (rank == 0 and step == 2) else 1.0 + 0.1 * step


def train(logger, rank, steps=6):
    for step in range(steps):
        loss = 1.0 / (step + 1) + 0.05 * rank
        metrics = {"loss": loss}
        if local_grad_norm(rank, step) > 5.0:
            # BUG: key added from a rank-local value, so only rank 0 logs it.
            metrics["clip_events"] = 1.0
        logger.log_dict(metrics)
        print(f"[rank{rank}] step {step}: {logger.history['loss'][-1]:.3f}", flush=True)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    logger = MetricLogger()
    train(logger, rank)
    summary = torch.tensor([6.0, sum(logger.history["loss"]), min(logger.history["loss"])])
    dist.all_reduce(summary)
    print(f"[rank{rank}] summary {summary.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""t02: every rank asks `exists()` of a checkpoint only rank 0 writes (KempnerForge #49).

Report: https://github.com/KempnerInstitute/KempnerForge/issues/49
("Race in CheckpointManager save and load collectives"; fixed by
https://github.com/KempnerInstitute/KempnerForge/pull/50).

What the report says: `CheckpointManager.save()` returns on non-rank-0 before
rank 0 has committed `train_state.pt` (no barrier at its end), and
`CheckpointManager.load()` calls `train_state_path.exists()` independently on
every rank.  When the answers disagree, some ranks enter the `torch.load`
branch and its `broadcast_object_list`, the others skip it, and the job
deadlocks because the skipping ranks never post the matching collective.

Kept: `save()` is rank-0-only and returns at once elsewhere; rank 0 writes
the state atomically (a temporary file, then `os.replace`, so the path appears
only when complete); `load()` asks `exists()` on every rank and, where true,
loads the file and joins a `broadcast_object_list` of rank 0's metadata.

Simplified: the divergence in the report comes from NFS/Lustre attribute
caching; here every rank shares one local disk, so what separates the two
answers is only how long rank 0's write takes against the local work rank 1
does between `save()` and `load()` (an evaluation pass, ~150 ms).  The loop
saves every SAVE_EVERY steps and then immediately evaluates and reloads the
checkpoint it just saved (standing in for a resume/eval-from-checkpoint path);
the state is a ~1 MiB tensor written in 64 KiB chunks with `open()`.  In a
normal run rank 0's write takes a few ms, rank 1 always finds the file.

Trigger (docs/chaos.md kinds): `io-delay` on rank 0 (or on all ranks) of
>= ~10 ms per read/write, path matching the run's working directory (`*`
will do), active during any of the 6 saves (every SAVE_EVERY steps across the
loop): rank 0's 17 chunk writes then outlast rank 1's evaluation.  A
`rank-pause` of rank 0 >= ~200 ms landing inside its save can do it too.
Expected divergence: rank 1's `exists()` is False, it skips `load()`'s
`broadcast_object_list` (line marked LOAD-BCAST) and enters the next step's
gradient `all_reduce` (line marked GRAD), while rank 0 is in the
`broadcast_object_list`: a mismatch (gloo size-mismatch abort) or a hang.
"""

import io
import os
import time

import torch
import torch.distributed as dist

STEPS = 48
SAVE_EVERY = 8
CHUNK = 64 * 1024
# one folder per launch (torchrun gives each launch its own run id), so a
# rerun in the same folder never finds an old run's files
CKPT_DIR = "t02_ckpt_" + os.environ.get("TORCHELASTIC_RUN_ID", "local")


class CheckpointManager:
    def __init__(self, rank):
        self.rank = rank
        os.makedirs(CKPT_DIR, exist_ok=True)

    def path(self, step):
        return os.path.join(CKPT_DIR, f"step{step}_train_state.pt")

    def save(self, step, state):
        if self.rank != 0:
            return                       # no barrier: the bug of the report
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        tmp = self.path(step) + ".tmp"
        with open(tmp, "wb") as f:
            for off in range(0, len(data), CHUNK):
                f.write(data[off:off + CHUNK])
        os.replace(tmp, self.path(step))

    def load(self, step):
        path = self.path(step)
        if not os.path.exists(path):     # asked on every rank: the bug
            return None
        with open(path, "rb") as f:
            state = torch.load(io.BytesIO(f.read()), weights_only=True)
        meta = [{"step": int(state["step"]), "norm": float(state["w"].norm())}]
        dist.broadcast_object_list(meta, src=0)   # LOAD-BCAST
        return meta[0]


def evaluate(w, x):
    # a short local evaluation pass (~150 ms of compute, no collective)
    t_end = time.perf_counter() + 0.15
    acc = 0.0
    while time.perf_counter() < t_end:
        acc += float(torch.tanh(x @ w).sum())
    return acc


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ckpt = CheckpointManager(rank)
    w = torch.randn(512, 512) * 0.01     # ~1 MiB of state
    x = torch.randn(64, 512)
    loaded = 0
    for step in range(1, STEPS + 1):
        g = torch.tanh(x @ w).t() @ x / 64.0
        dist.all_reduce(g)               # GRAD
        w -= 0.01 * g.t()
        time.sleep(0.06)
        if step % SAVE_EVERY == 0:
            ckpt.save(step, {"step": step, "w": w})
            evaluate(w, x)
            meta = ckpt.load(step)
            if meta is not None:
                loaded += 1
    dist.barrier()
    # one write per line, so the two ranks' lines never cut into each other
    os.write(1, (f"rank {rank} steps={STEPS} loaded={loaded} norm={float(w.norm()):.4f}" + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

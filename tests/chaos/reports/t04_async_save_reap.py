"""t04: a non-blocking reap of async checkpoint saves polls a rank-local future (AReaL #1356).

Report: https://github.com/areal-project/AReaL/pull/1356
("feat(megatron): implement async_save with AsyncCallsQueue"), whose
"Hardening" section names the hazard: "An earlier non-blocking reap can leave
ranks skewed on which call has finalized (process-exit timing differs), and
`maybe_finalize_async_calls(blocking=True)` is a collective.  Skipping it on a
subset of ranks deadlocks the cluster."  The finalize collective is the one in
NVIDIA/nvidia-resiliency-ext's `AsyncCallsQueue.maybe_finalize_async_calls`
(https://github.com/NVIDIA/nvidia-resiliency-ext/pull/88: an all_reduce(MAX)
of the call index, asserting "Unmatched async calls. That probably means not
all ranks are participating in async finalization").

Kept: every rank schedules an async save of its own shard every SAVE_EVERY
steps (a background writer, standing in for the async checkpoint process)
and gets a future back; after each training step it reaps finished saves
WITHOUT blocking by looking at its own future (`future.done()`), and for each
finished call runs the finalize, which all_reduces the call index.  At the
end it finalizes whatever is left, blocking.

Simplified: a thread with a `queue.Queue` instead of a forked process, a
`concurrent.futures.Future` instead of the process-exit check, a ~1 MiB shard
written in 64 KiB chunks with `open()` instead of a distributed checkpoint.
In a normal run the shard is written within a few ms, and the next reap comes
one step (~110 ms) after the save was scheduled, so both ranks see their
future done at the same reap.

Trigger (docs/chaos.md kinds): on ONE rank, during any of the 7 saves (every
SAVE_EVERY steps across the loop), either an `io-delay` of >= ~8 ms per write
(path `*` or the run's folder: 17 writes then outlast a step) or a
`thread-slow` of >= ~120 ms (the writer returns late from `queue.Queue.get`,
line marked GET).  Expected divergence: the delayed rank's future is not done
at the reap after the save, so it skips the finalize `all_reduce` (line marked
FINALIZE) and enters the next step's gradient `all_reduce` (line marked GRAD),
while its peer is in the finalize: a gloo size-mismatch abort or a hang.
"""

import collections
import concurrent.futures
import io
import os
import queue
import threading
import time

import torch
import torch.distributed as dist

STEPS = 42
SAVE_EVERY = 6
CHUNK = 64 * 1024
CKPT_DIR = "t04_ckpt_" + os.environ.get("TORCHELASTIC_RUN_ID", "local")


class AsyncCallsQueue:
    def __init__(self):
        self.calls = collections.deque()
        self.call_idx = 0
        self.q = queue.Queue()
        self.writer = threading.Thread(target=self._writer, name="async_ckpt_writer", daemon=True)
        self.writer.start()

    def _writer(self):
        while True:
            item = self.q.get()                                    # GET
            if item is None:
                return
            fut, path, data = item
            try:
                tmp = path + ".tmp"
                with open(tmp, "wb") as f:
                    for off in range(0, len(data), CHUNK):
                        f.write(data[off:off + CHUNK])
                os.replace(tmp, path)
                fut.set_result(path)
            except BaseException as e:   # noqa: BLE001 - handed to the finalize
                fut.set_exception(e)

    def schedule_async_save(self, path, state):
        buf = io.BytesIO()
        torch.save(state, buf)                  # staged synchronously
        fut = concurrent.futures.Future()
        self.q.put((fut, path, buf.getvalue()))
        self.calls.append((self.call_idx, fut))
        self.call_idx += 1

    def maybe_finalize_async_calls(self, blocking=False):
        finalized = []
        while self.calls and (blocking or self.calls[0][1].done()):   # rank-local poll: the bug
            idx, fut = self.calls.popleft()
            fut.result()
            ten = torch.tensor([idx], dtype=torch.int32)
            dist.all_reduce(ten, op=dist.ReduceOp.MAX)              # FINALIZE
            assert ten.item() == idx, "Unmatched async calls."
            finalized.append(idx)
        return finalized

    def close(self):
        self.q.put(None)
        self.writer.join()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    os.makedirs(CKPT_DIR, exist_ok=True)
    calls = AsyncCallsQueue()
    w = torch.randn(512, 512) * 0.01            # this rank's ~1 MiB shard
    x = torch.randn(64, 512)
    finalized = 0
    for step in range(1, STEPS + 1):
        g = torch.tanh(x @ w).t() @ x / 64.0
        dist.all_reduce(g)                                          # GRAD
        w -= 0.01 * g.t()
        time.sleep(0.10)
        finalized += len(calls.maybe_finalize_async_calls(blocking=False))
        if step % SAVE_EVERY == 0:
            path = os.path.join(CKPT_DIR, f"step{step}_rank{rank}.pt")
            calls.schedule_async_save(path, {"step": step, "w": w.clone()})
    finalized += len(calls.maybe_finalize_async_calls(blocking=True))
    calls.close()
    dist.barrier()
    # one write per line, so the two ranks' lines never cut into each other
    os.write(1, (f"rank {rank} steps={STEPS} finalized={finalized}" + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

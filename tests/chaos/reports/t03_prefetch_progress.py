"""t03: a prefetch thread's bookkeeping decides whether a rank joins an all_reduce (SGLang #38273).

Report: https://github.com/sgl-project/sglang/pull/38273
("fix: Prevent gloo same-group deadlock in check_prefetch_progress"; the same
fix was proposed as #38268, #38270 and #38284).

What the report says: HiCache's `check_prefetch_progress(req_id)` returns True
at once when `req_id` is not in the rank's `ongoing_prefetch`, and otherwise
calls `can_terminate_prefetch`, which all_reduces (MAX) the termination vote
over the TP group.  When `ongoing_prefetch` differs across ranks "due to
timing differences in prefetch completion", the ranks that still hold the
request enter the all_reduce and the others move on to the next scheduler
iteration: a permanent hang on the shared gloo group (seen in production,
TP=8, all ranks in futex_wait).

Kept: the scheduler (main thread) registers every new request in
`ongoing_prefetch` and hands it to a per-rank prefetch thread through a
`queue.Queue`; the prefetch thread queries storage and, when storage holds
nothing for the request, drops it from `ongoing_prefetch` itself (the
rank-local, timing-dependent removal); for a hit it "loads" the pages and
marks the operation done.  On the next scheduler tick the main thread calls
`check_prefetch_progress` for each waiting request: not in `ongoing_prefetch`
-> True without a collective, else an all_reduce(MAX) of the vote.

Simplified: no radix tree, no host pool, no storage backend: "storage hits"
are a deterministic function of the request id (every other request misses),
a hit's load is a `time.sleep` of 10 ms per page on the prefetch thread,
the forward is one all_reduce, requests are generated identically on every
rank (SGLang broadcasts them), and a request is first checked two ticks after
it arrived (standing in for the queue ahead of it).  In a normal run the
prefetch thread takes the request from its queue within a millisecond, while
the main thread checks it ~220 ms later, so both ranks agree that a missed
request is gone.  (A first version checked after one tick, ~110 ms: one plain
run in ten diverged on its own on this loaded 2-core box, the prefetch thread
starved of CPU for that long: the report's bug without any fault.)

Trigger (docs/chaos.md kinds): `thread-slow` on ONE rank of >= ~250 ms (the
prefetch thread returns late from `queue.Queue.get`, line marked GET), during
any tick whose new request is a storage miss (every other tick of the loop).
Expected divergence: the slow rank still has the missed request in
`ongoing_prefetch` and enters `can_terminate_prefetch`'s `all_reduce` (line
marked VOTE) while its peer, which already dropped it, enters the forward's
`all_reduce` (line marked FORWARD) of a different size: a gloo size-mismatch
abort or a hang.
"""

import os
import queue
import threading
import time

import torch
import torch.distributed as dist

STEPS = 40
TICK_SLEEP_S = 0.10
CHECK_AFTER_TICKS = 2   # a request reaches the check two ticks after it arrived
HIDDEN = 256


class PrefetchOp:
    def __init__(self, rid):
        self.rid = rid
        self.done = False


class HiCache:
    def __init__(self):
        self.ongoing_prefetch = {}
        self.lock = threading.Lock()
        self.q = queue.Queue()
        self.thread = threading.Thread(target=self._prefetch_thread, name="prefetch_thread", daemon=True)
        self.thread.start()

    @staticmethod
    def storage_hit_pages(rid):
        return 0 if rid % 2 == 1 else 1 + rid % 3

    def prefetch_from_storage(self, rid):
        op = PrefetchOp(rid)
        with self.lock:
            self.ongoing_prefetch[rid] = op
        self.q.put(op)

    def _prefetch_thread(self):
        while True:
            op = self.q.get()                          # GET
            if op is None:
                return
            pages = self.storage_hit_pages(op.rid)
            if pages == 0:
                # nothing in storage: revoke the prefetch, rank-locally
                with self.lock:
                    self.ongoing_prefetch.pop(op.rid, None)
                continue
            time.sleep(0.01 * pages)                   # load the pages
            op.done = True

    def check_prefetch_progress(self, rid):
        with self.lock:
            op = self.ongoing_prefetch.get(rid)
        if op is None:
            return True                                # no collective: the bug
        vote = torch.tensor([0 if op.done else 1, 0], dtype=torch.int64)
        dist.all_reduce(vote, op=dist.ReduceOp.MAX)    # VOTE
        if vote[0].item() == 0:
            with self.lock:
                self.ongoing_prefetch.pop(rid, None)
            return True
        return False

    def close(self):
        self.q.put(None)
        self.thread.join()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    cache = HiCache()
    waiting = []
    running = 0
    checksum = 0.0
    a = torch.randn(128, 128)
    for step in range(STEPS + 5):
        # admit the waiting requests whose prefetch is over
        still = []
        for rid, since in waiting:
            if step - since < CHECK_AFTER_TICKS:       # not yet at the head
                still.append((rid, since))
            elif cache.check_prefetch_progress(rid):
                running += 1
            else:
                still.append((rid, since))
        waiting = still
        x = torch.full((HIDDEN,), float(running))
        dist.all_reduce(x)                             # FORWARD
        checksum += float(x[0])
        for _ in range(3):
            a = torch.tanh(a @ a)
        time.sleep(TICK_SLEEP_S)
        if step < STEPS:                               # one new request a tick
            rid = step
            cache.prefetch_from_storage(rid)
            waiting.append((rid, step))
    cache.close()
    dist.barrier()
    # one write per line, so the two ranks' lines never cut into each other
    os.write(1, (f"rank {rank} admitted={running} waiting={len(waiting)} checksum={checksum:.0f}" + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""t01: a waiting-queue timeout decided on each rank's own clock (SGLang #27221).

Report: https://github.com/sgl-project/sglang/issues/27221
("[Bug] TP rank-divergence deadlock from per-rank clocks in abort-on-timeout";
fixed by https://github.com/sgl-project/sglang/pull/37143).

What the report says: with TP > 1 and SGLANG_REQ_WAITING_TIMEOUT set, each
scheduler rank runs `_abort_on_waiting_timeout` against its OWN
`time.perf_counter()` and drops the timed-out requests from its local
`waiting_queue`, with no cross-rank agreement.  A request whose wait straddles
the deadline is aborted on one rank and kept on another; the ranks then build
different batches and the forward's collective gets different shapes (or one
rank has nothing to run and skips it): a permanent TP hang.

Kept: requests arrive on rank 0 and are broadcast to every rank (SGLang's
`broadcast_pyobj` of the received requests); each rank stamps the request with
its own `time.perf_counter()` when it enters its waiting queue; at the top of
every scheduler tick each rank aborts, by its own clock, what has waited longer
than WAITING_TIMEOUT_S, then takes up to MAX_BATCH requests and runs a
"forward" whose all_reduce is sized by the batch (an idle rank runs none).

Simplified: no model, no tokenizer, no HTTP; requests are integers drawn from
a seeded generator on rank 0; the forward is one all_reduce of
len(batch) * HIDDEN floats; MAX_BATCH is large enough that the queue drains
every tick, so in a normal run every request waits exactly one tick (about
200 ms, most of it the tick's own sleep) against a 350 ms timeout and nothing
is ever aborted: the abort path is latent.

Trigger (docs/chaos.md kinds), on ONE rank, at any tick of the 25-tick loop
(~5 s) where that rank has queued requests (5 ticks in 6): a `clock-jump` of
>= ~150 ms (the requests stamped before the jump look > 350 ms old on that rank
only), a `clock-skew` of >= ~800 ms per second, or a `rank-pause` of >= ~150 ms
that stops the rank during its tick (its own clock keeps running while its
peer has already checked and gone on to the forward).  That rank aborts them
(line marked ABORT below) and its batch is smaller or empty.  Expected divergence: the jumped rank's `all_reduce` in
`forward` (line marked FORWARD) has a different size from its peer's, or it
skips it and enters the next tick's `broadcast_object_list` (line marked RECV)
while the peer is in the forward's `all_reduce`: a gloo size-mismatch abort or
a hang.
"""

import os
import random
import time

import torch
import torch.distributed as dist

STEPS = 25
WAITING_TIMEOUT_S = 0.35   # SGLANG_REQ_WAITING_TIMEOUT, scaled down
MAX_BATCH = 8
HIDDEN = 64
TICK_SLEEP_S = 0.18        # the rest of a scheduler tick (detokenize, output, ...)


class Req:
    def __init__(self, rid):
        self.rid = rid
        self.wait_queue_entry_time = time.perf_counter()   # this rank's clock


def recv_requests(rank, rng, step):
    # rank 0 receives from the tokenizer; everyone gets the list by broadcast
    if rank == 0:
        n = rng.choice([0, 1, 1, 2, 2, 3])
        payload = [[step * 10 + k for k in range(n)]]
    else:
        payload = [None]
    dist.broadcast_object_list(payload, src=0)   # RECV
    return [Req(rid) for rid in payload[0]]


def abort_on_waiting_timeout(waiting):
    now = time.perf_counter()                    # each rank's own clock: the bug
    kept, aborted = [], []
    for req in waiting:
        if now - req.wait_queue_entry_time > WAITING_TIMEOUT_S:
            aborted.append(req)                  # ABORT
        else:
            kept.append(req)
    return kept, aborted


def forward(batch, w):
    x = torch.ones(len(batch) * HIDDEN) * w
    dist.all_reduce(x)                           # FORWARD
    return float(x.sum())


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    rng = random.Random(1234)
    waiting = []
    served = aborted_total = 0
    checksum = 0.0
    a = torch.randn(128, 128)
    for step in range(STEPS):
        waiting, aborted = abort_on_waiting_timeout(waiting)
        aborted_total += len(aborted)
        batch, waiting = waiting[:MAX_BATCH], waiting[MAX_BATCH:]
        if batch:                                # an idle rank runs no forward
            checksum += forward(batch, 1.0 + step)
            served += len(batch)
        waiting.extend(recv_requests(rank, rng, step))
        for _ in range(3):                       # the rest of the tick
            a = torch.tanh(a @ a)
        time.sleep(TICK_SLEEP_S)
    # drain what arrived in the last tick
    waiting, aborted = abort_on_waiting_timeout(waiting)
    aborted_total += len(aborted)
    if waiting:
        checksum += forward(waiting, 1.0 + STEPS)
        served += len(waiting)
    dist.barrier()
    # one write per line, so the two ranks' lines never cut into each other
    os.write(1, (f"rank {rank} served={served} aborted={aborted_total} checksum={checksum:.1f}" + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

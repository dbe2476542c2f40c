"""Every way the corpus calls a collective, each a few times (the first sighting
of a site, shape, reduce op or thread is interned by the Python path; repeats
are what the C hot path records), plus calls the recorder must leave alone or
record as failed. test_fastpath.py runs it with and without the C path and
compares the traces. Writes the C path's counters to $STATS_DIR/rank{R}.json."""

import json
import os
import threading

import torch
import torch.distributed as dist

from common import finish, init

rank, world = init()
t = torch.ones(3)
sub = dist.new_group([0, 1])
only0 = dist.new_group([0])  # rank 1 is not a member: its calls on it are not recorded
for _ in range(3):
    dist.all_reduce(t)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.all_reduce(t, dist.ReduceOp.MIN)
    dist.all_reduce(tensor=t, group=sub)
    dist.all_reduce(t, async_op=True).wait()
    dist.broadcast(t, src=1)
    dist.broadcast(t, 0)
    dist.reduce(t, dst=1)
    dist.all_gather_into_tensor(torch.zeros(3 * world), t)
    dist.all_gather([torch.zeros(3) for _ in range(world)], t)
    dist.barrier()
    dist.all_reduce(t, group=only0)
    for n in (1, 2, 1, 2):  # one site, shapes alternating
        dist.all_reduce(torch.ones(n, dtype=torch.int64))  # SITE:alternating
    if rank == 0:
        dist.send(t, dst=1)
        dist.isend(t, 1).wait()
    else:
        dist.recv(t, src=0)
        dist.irecv(t, src=0).wait()
    dist.broadcast_object_list([{"step": 1}], src=0)  # objects: Python describes them; inner calls not recorded
    try:
        dist.all_reduce(t, bogus=1)  # a wrong call: torch's TypeError, nothing recorded
    except TypeError:
        pass
    try:
        dist.broadcast(t, src=world + 3)  # torch raises after the record: recorded as failed
    except (ValueError, RuntimeError):
        pass


def helper():
    for _ in range(3):
        dist.all_reduce(t, group=sub)


th = threading.Thread(target=helper, name="helper")
th.start()
th.join()

# Two threads at once, one group each: the C path's per-call caches (thread, group)
# switch between them while both record.
groups = {"left": dist.new_group([0, 1]), "right": dist.new_group([0, 1])}


def busy(name):
    x = torch.ones(2)
    for _ in range(40):
        dist.all_reduce(x, group=groups[name])


threads = [threading.Thread(target=busy, args=(n,), name=n) for n in groups]
for th in threads:
    th.start()
for th in threads:
    th.join()
# The same, in a fixed order: "first" is cached, "second" (a new thread at the same call site)
# misses, then "first" calls again and must still be named as itself.
turn = {name: threading.Event() for name in ("second", "first_again")}


def in_turn(name):
    x = torch.ones(2)
    for i in range(3):
        if name == "second" and i == 0:
            turn["second"].wait(30)
        if name == "first" and i == 2:
            turn["first_again"].wait(30)
        dist.all_reduce(x, group=groups["left" if name == "first" else "right"])
        if name == "first" and i == 1:
            turn["second"].set()
        if name == "second" and i == 0:
            turn["first_again"].set()


threads = [threading.Thread(target=in_turn, args=(n,), name=n) for n in ("first", "second")]
for th in threads:
    th.start()
for th in threads:
    th.join()
mod = __import__("hctool.agent.capture.wrappers", fromlist=["_fastpath"])._fastpath
stats = mod.stats() if mod is not None else None
with open(os.path.join(os.environ["STATS_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump(stats, f)
finish()

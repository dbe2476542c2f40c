"""Each rule on positive snippets, and the negatives a naive linter gets wrong.

Expected findings are marked in the snippets with `# expect: HCxxx` on the reported line.
"""

from __future__ import annotations

from .conftest import expected

HEADER = "import time\nimport torch\nimport torch.distributed as dist\n"


def check(lint_snippets, files):
    files = {name: HEADER + text.lstrip("\n") if name.endswith(".py") else text for name, text in files.items()}
    found, report = lint_snippets(files)
    assert not report.errors
    assert found == expected(files)
    return report


def test_hc101_loop_exits_on_free_count(lint_snippets):
    check(lint_snippets, {"m.py": """
def admit(pool, reqs, group):
    for req in reqs:
        if pool.available_size() < req.size:
            break
        flag = torch.tensor([1])
        dist.all_reduce(flag, group=group)  # expect: HC101
"""})


def test_hc101_loop_trip_count_from_event_polls(lint_snippets):
    check(lint_snippets, {"m.py": """
def drain(events, group):
    n = 0
    while events[n].query():
        dist.barrier(group=group)  # expect: HC101
        n += 1
"""})


def test_hc101_continue_only_skips_later_collectives(lint_snippets):
    check(lint_snippets, {"m.py": """
def poll(reqs, group, t):
    for req in reqs:
        dist.all_reduce(t, group=group)
        if not req.event.query():
            continue
        dist.all_reduce(t, group=group)  # expect: HC101
"""})


def test_hc101_30760_shape_through_helpers_and_attributes(lint_snippets):
    report = check(lint_snippets, {
        "sched.py": """
from adder import Adder
from cache import Cache


class Scheduler:
    tree_cache: Cache  # the receiver's declared type: methods resolve through it, never by name

    def get_new_batch(self):
        adder = Adder(self.allocator)
        for req in self.waiting_queue:
            if adder.rem_tokens <= 0:
                self.batch_is_full = True
                break
            if not self.tree_cache.check_progress(req.rid):  # expect: HC101
                continue
            if adder.add_one(req) != 0:
                break
""",
        "adder.py": """
class Adder:
    def __init__(self, allocator):
        self.allocator = allocator
        self.used = 0

    @property
    def rem_tokens(self):
        return self.allocator.available_size() - self.used

    def add_one(self, req):
        return 0 if req.n <= self.rem_tokens else 1
""",
        "cache.py": """
class Cache:
    def check_progress(self, rid):
        return self._vote(rid)

    def _vote(self, rid):
        t = torch.tensor([rid in self.ongoing])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())
""",
    })
    (f,) = report.findings
    lines = [(p, ln) for p, ln, _ in f.related]
    assert lines[:2] == [("sched.py", 13), ("sched.py", 14)]  # the loop, the break condition
    assert ("adder.py", 11) in lines  # available_size(), the rank-local source
    assert lines[-2:] == [("cache.py", 6), ("cache.py", 10)]  # the call chain down to all_reduce
    assert f.rule == "HC101" and "`break` at line 16" in f.message and f.severity == "high"


def test_hc101_negative_broadcast_list_and_uniform_exits(lint_snippets):
    check(lint_snippets, {"m.py": """
def tick(rank, group, t):
    reqs = [None]
    dist.broadcast_object_list(reqs, src=0, group=group)
    for req in reqs[0]:
        if req is None:
            break
        dist.all_reduce(t, group=group)
    n = torch.tensor([len(reqs[0])])
    dist.all_reduce(n, op=dist.ReduceOp.MIN, group=group)
    for _ in range(int(n.item())):
        dist.all_reduce(t, group=group)
    ready = torch.tensor([count_ready()])
    dist.all_reduce(ready, op=dist.ReduceOp.MIN, group=group)
    while ready.item() > 0:
        dist.all_reduce(t, group=group)
        ready -= 1
"""})


def test_hc102_branch_on_rank_local_state(lint_snippets):
    check(lint_snippets, {"m.py": """
def step(pool, event, group, t):
    if pool.available_size() > 8:
        dist.all_reduce(t, group=group)  # expect: HC102
    if dist.get_rank() == 0:
        dist.barrier()  # expect: HC102
    ok = event.query() and dist.all_reduce(t, group=group)  # expect: HC102
"""})


def test_hc102_negatives_uniform_guards_balanced_arms_collective_results(lint_snippets):
    check(lint_snippets, {"m.py": """
def step(pool, group, t, world_size):
    if dist.is_initialized():
        dist.barrier(group=group)
    if world_size > 1:
        dist.all_reduce(t, group=group)
    if dist.get_world_size() > 1:
        dist.all_reduce(t, group=group)
    if pool.available_size() > 8:
        dist.all_reduce(t, group=group)
    else:
        dist.all_reduce(torch.zeros(1), group=group)
    free = torch.tensor([pool.available_size()])
    dist.all_reduce(free, op=dist.ReduceOp.MIN, group=group)
    if free.item() > 8:
        dist.all_reduce(t, group=group)
    if dist.get_rank() == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
"""})


def test_hc103_early_return_skips_collective(lint_snippets):
    check(lint_snippets, {"m.py": """
class Controller:
    def is_load_back_done(self, idx):
        if not self.events[idx].query():
            return False
        return self.loading_check()  # expect: HC103

    def loading_check(self):
        n = torch.tensor([self.ready])
        dist.all_reduce(n, op=dist.ReduceOp.MIN, group=self.group)
        return int(n.item())
"""})


def test_hc103_negatives_uniform_exit_and_exit_after_agreement(lint_snippets):
    check(lint_snippets, {"m.py": """
def f(group, t, tp_size, pool):
    if tp_size == 1:
        return t
    if not dist.is_initialized():
        return t
    local = torch.tensor([pool.available_size()])
    dist.all_reduce(local, op=dist.ReduceOp.MIN, group=group)
    if local.item() == 0:
        return None
    dist.all_reduce(t, group=group)
    return t
"""})


def test_hc104_wall_clock_eviction_order(lint_snippets):
    check(lint_snippets, {"m.py": """
import heapq


class Node:
    def __init__(self):
        self.last_access_time = time.monotonic()

    def __lt__(self, other):  # expect: HC104
        return self.last_access_time < other.last_access_time


def evict(nodes, group, t):
    victims = sorted(nodes, key=lambda n: n.last_access_time)  # expect: HC104
    heap = []
    heapq.heappush(heap, (time.time(), 1))  # expect: HC104
    by_id = sorted(nodes, key=lambda n: n.node_id)
    dist.all_reduce(t, group=group)
    return victims, heap, by_id
"""})


def test_hc104_needs_collectives_in_the_tree(lint_snippets):
    found, _ = lint_snippets({"m.py": "import time\n\ndef f(xs):\n    return sorted(xs, key=lambda x: time.time())\n"})
    assert found == set()


def test_hc104_only_in_the_program_that_issues_collectives(lint_snippets):
    """An engine linted beside its launcher: the launcher's wall-clock sorts order nothing ranks
    replicate; the engine's, through a module-level alias of `time`, do."""
    check(lint_snippets, {
        "engine/__init__.py": "", "launcher/__init__.py": "",
        "engine/lru.py": """
clock = time


def evict(nodes, t):
    victims = sorted(nodes, key=lambda n: clock.monotonic())  # expect: HC104
    dist.all_reduce(t)
    return victims
""",
        "launcher/supervise.py": """
def first_death(deaths):
    return min(deaths, key=lambda d: time.monotonic())
""",
    })

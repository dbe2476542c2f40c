"""Each rule on positive snippets, and the negatives a naive linter gets wrong.

A finding is reported at its rank-local source (`# expect: HCxxx`); the collectives it gates are
its related lines (`# gated`).
"""

from __future__ import annotations

from .conftest import expected, expected_gated, gated

HEADER = "import time\nimport torch\nimport torch.distributed as dist\n"
# The pools the snippets read free counts of (`pool`, `allocator`) get pages back on each rank when that
# rank's copy event fires: their counts can differ between ranks (what a free count finding rests on).
LAGGING_FREES = """
def _on_copy_done(pool, allocator, event, pages):
    if event.query():
        pool.free(pages)
        allocator.free(pages)
"""


def check(lint_snippets, files):
    files = {
        name: HEADER + text.lstrip("\n") + LAGGING_FREES if name.endswith(".py") else text
        for name, text in files.items()
    }
    found, report = lint_snippets(files)
    assert not report.errors
    assert found == expected(files), [(f.path, f.rule, f.line, f.message) for f in report.findings]
    assert gated(report) == expected_gated(files)
    return report


def test_hc101_loop_exits_on_free_count(lint_snippets):
    report = check(
        lint_snippets,
        {
            "m.py": """
def admit(pool, reqs, group):
    for req in reqs:
        if pool.available_size() < req.size:  # expect: HC101
            break
        flag = torch.tensor([1])
        dist.all_reduce(flag, group=group)  # gated
"""
        },
    )
    (f,) = report.findings
    assert (f.severity, f.count) == ("medium", 1) and "free count" in f.premise  # a pool: a premise


def test_any_pools_free_count_is_a_premise_source_without_configuration(lint_snippets):
    # The README's example: no name of this pool or its method is configured anywhere.
    report = check(
        lint_snippets,
        {
            "m.py": """
class Scheduler:
    def step(self, x):
        if self.pool.free_count() < 4:  # expect: HC102
            dist.all_reduce(x)  # gated

    def admit(self, allocator, x):
        while allocator.get_num_free_blocks() > 0:  # expect: HC101
            dist.broadcast(x, src=0)  # gated

    def release(self, allocator, blocks, x):
        # the verb that frees (it takes what to free) and names without a quantity are no observations
        if allocator.free_blocks(blocks) or self.pool.free():
            dist.all_reduce(x)
        if allocator.get_free_port():
            dist.all_reduce(x)
"""
        },
    )
    assert {(f.severity, f.premise is not None) for f in report.findings} == {("medium", True)}


def test_hc101_loop_trip_count_from_event_polls(lint_snippets):
    report = check(
        lint_snippets,
        {
            "m.py": """
def drain(events, group):
    n = 0
    while events[n].query():  # expect: HC101
        dist.barrier(group=group)  # gated
        n += 1
"""
        },
    )
    assert report.findings[0].severity == "high" and report.findings[0].premise is None


def test_hc101_continue_only_skips_later_collectives(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
def poll(reqs, group, t):
    for req in reqs:
        dist.all_reduce(t, group=group)
        if not req.event.query():  # expect: HC101
            continue
        dist.all_reduce(t, group=group)  # gated
"""
        },
    )


def test_hc101_30760_shape_through_helpers_and_attributes(lint_snippets):
    report = check(
        lint_snippets,
        {
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
            if not self.tree_cache.check_progress(req.rid):  # gated
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
        return self.allocator.available_size() - self.used  # expect: HC101

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
        },
    )
    (f,) = report.findings
    lines = [(r.path, r.line, r.role) for r in f.related if r.role != "source"]
    # the premise's evidence: the allocator's pages come back under an event poll (LAGGING_FREES)
    assert any(r.role == "source" and r.message.startswith("the premise") for r in f.related)
    assert lines[:4] == [
        ("sched.py", 17, "collective"),
        ("sched.py", 13, "loop"),
        ("sched.py", 14, "condition"),
        ("sched.py", 16, "exit"),
    ]  # the call, the loop, the break's condition, the break
    assert lines[-2:] == [("cache.py", 6, "chain"), ("cache.py", 10, "chain")]  # down to the all_reduce
    assert f.rule == "HC101" and "`break` at line 16" in f.message and f.function == "Adder.rem_tokens"


def test_one_finding_per_source_with_every_gated_collective(lint_snippets):
    """One early return that skips three collectives, two of them one call apart: one finding."""
    report = check(
        lint_snippets,
        {
            "m.py": """
class Cache:
    def sync(self, t):
        if not self.event.query():  # expect: HC103
            return
        dist.all_reduce(t, group=self.group)  # gated
        self.vote(t)  # gated
        dist.barrier(group=self.group)  # gated

    def vote(self, t):
        dist.all_reduce(t, group=self.group)
"""
        },
    )
    (f,) = report.findings
    assert f.count == 3 and "3 collective calls" in f.message


def test_two_sources_of_one_collective_are_two_findings(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
def step(pool, event, t):
    if event.query():  # expect: HC102
        if pool.available_size() > 4:  # expect: HC102
            dist.all_reduce(t)  # gated
"""
        },
    )


def test_hc101_negative_broadcast_list_and_uniform_exits(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
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
"""
        },
    )


def test_hc102_branch_on_rank_local_state(lint_snippets):
    report = check(
        lint_snippets,
        {
            "m.py": """
def step(pool, event, group, t):
    if pool.available_size() > 8:  # expect: HC102
        dist.all_reduce(t, group=group)  # gated
    if dist.get_rank() == 0:  # expect: HC102
        dist.barrier()  # gated
    ok = event.query() and dist.all_reduce(t, group=group)  # expect: HC102, gated
"""
        },
    )
    assert [f.severity for f in report.findings] == ["medium", "high", "high"]  # pool, rank id compared, poll


def test_hc102_negatives_uniform_guards_balanced_arms_collective_results(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
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
"""
        },
    )


def test_hc103_early_return_skips_collective(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
class Controller:
    def is_load_back_done(self, idx):
        if not self.events[idx].query():  # expect: HC103
            return False
        return self.loading_check()  # gated

    def loading_check(self):
        n = torch.tensor([self.ready])
        dist.all_reduce(n, op=dist.ReduceOp.MIN, group=self.group)
        return int(n.item())
"""
        },
    )


def test_hc103_negatives_uniform_exit_and_exit_after_agreement(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
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
"""
        },
    )


def test_hc104_stamp_order_in_a_collectives_contents(lint_snippets):
    """An order of per-rank stamps is an order of replicated events within one rank, so sorting or
    heaping by them decides nothing across ranks; it does where the ordered list is what ranks send."""
    check(
        lint_snippets,
        {
            "m.py": """
import heapq


class Node:
    def __init__(self):
        self.last_access_time = time.monotonic()

    def __lt__(self, other):
        return self.last_access_time < other.last_access_time


def evict(nodes, group, t):
    victims = sorted(nodes, key=lambda n: n.last_access_time)
    heap = []
    heapq.heappush(heap, (time.time(), 1))
    dist.all_reduce(t, group=group)
    return victims, heap


def share_victims(nodes, group):
    victims = sorted(nodes, key=lambda n: n.last_access_time)  # expect: HC104
    ids = torch.tensor([v.node_id for v in victims])
    dist.all_reduce(ids, group=group)  # gated
"""
        },
    )


def test_hc104_needs_collectives_in_the_tree(lint_snippets):
    found, _ = lint_snippets({"m.py": "import time\n\ndef f(xs):\n    return sorted(xs, key=lambda x: time.time())\n"})
    assert found == set()


def test_hc104_deadline_decides_replicated_request_state(lint_snippets):
    """`_abort_on_running_timeout`: a per-rank deadline finishes requests of the replicated batch; only in
    a program that issues collectives (a launcher's own deadlines order nothing ranks replicate)."""
    check(
        lint_snippets,
        {
            "engine/__init__.py": "",
            "launcher/__init__.py": "",
            "engine/sched.py": """
clock = time


class Scheduler:
    def abort_on_running_timeout(self, batch, timeout_s):
        deadline = clock.perf_counter() - timeout_s
        for req in batch.reqs:
            if 0 < req.entry_time < deadline:  # expect: HC104
                req.to_finish = "abort"  # gated

    def log_slow(self, batch):
        for req in batch.reqs:
            if req.entry_time:  # a stamp is set: no deadline
                req.logged = True

    def poll_timeouts(self, waiting, timeout_s):
        now = clock.time()
        statuses = []
        for req in waiting:
            if now - req.start_time > timeout_s:
                req.status = 0  # this rank's verdict, then agreed: the MIN below is what counts
            statuses.append(req.status)
        t = torch.tensor(statuses)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)

    def step(self, t):
        dist.all_reduce(t)
""",
            "launcher/supervise.py": """
def reap(procs, deadline):
    for p in procs:
        if time.monotonic() > deadline:
            p.killed = True
""",
            "engine/supervisor.py": """
class Supervisor:
    # a cluster supervisor's heartbeat table in the same program (xinference's SupervisorActor): its
    # class issues no collective, so its items are nobody's replicated batch
    def check_heartbeats(self, workers, timeout_s):
        now = time.time()
        for status in workers:
            if now - status.update_time > timeout_s:
                status.failure_remaining_count = 0
""",
        },
    )


def test_a_name_defined_twice_is_checked_in_both_definitions(lint_snippets):
    # both arms of an `if` define f; a property's setter reuses its getter's name
    check(
        lint_snippets,
        {
            "m.py": """
DEBUG = False
if DEBUG:
    def f(ev):
        if ev.query():  # expect: HC102
            dist.barrier()  # gated
else:
    def f(ev):
        return 1


class C:
    @property
    def x(self):
        if self.ev.query():  # expect: HC102
            dist.barrier()  # gated
        return 1

    @x.setter
    def x(self, v):
        self._x = v
"""
        },
    )


def test_a_decorator_in_parentheses_over_several_lines_parses(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
@(
    staticmethod
)
def f(ev):
    if ev.query():  # expect: HC102
        dist.barrier()  # gated
"""
        },
    )


def test_suppress_and_a_swallowing_try_are_per_rank_failures(lint_snippets):
    # Issue 34's miss: a shared-memory create on the source rank inside suppress(OSError), ahead of the
    # broadcast the other ranks enter. A create that fails on that rank skips its broadcast only.
    report = check(
        lint_snippets,
        {
            "m.py": """
import contextlib
from multiprocessing import shared_memory

def same_node(pg, src):
    rank = dist.get_rank(group=pg)
    with contextlib.suppress(OSError):
        if rank == src:
            shm = shared_memory.SharedMemory(create=True, size=128)  # expect: HC102
            dist.broadcast_object_list([shm.name], src=src, group=pg)  # gated
        else:
            recv = [None]
            if isinstance(pg, dist.ProcessGroup):  # a type check fails on no rank (FastVideo's copy)
                dist.broadcast_object_list(recv, src=src, group=pg)
            shm = shared_memory.SharedMemory(name=recv[0])
    dist.barrier(group=pg)

def load(path, t):
    try:
        data = open(path).read()  # expect: HC102
        dist.broadcast(t, src=0)  # gated
    except Exception:
        data = None
    return data

def not_swallowed(t):
    with contextlib.suppress(ValueError):  # what a rank meets alone is I/O, not a ValueError
        x = int("3")
        dist.all_reduce(t)
    try:
        open("f").read()
        dist.all_reduce(t)
    except OSError:
        raise
"""
        },
    )
    assert all(f.severity == "high" for f in report.findings)


def test_rank_translations_memberships_and_other_dimensions_are_uniform(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
def translated(group, t, src_rank):
    g = dist.get_global_rank(group, src_rank)  # the same rank translated on every rank
    if g == 0:
        dist.barrier(group=group)

def member(embd_group, t):
    if dist.get_rank() in dist.get_process_group_ranks(embd_group):  # every member answers the same
        dist.all_reduce(t, group=embd_group)

def coordinates(mpu, t):
    # every rank of one data-parallel group has the same tensor-parallel rank
    if mpu.get_tensor_model_parallel_rank() != 0:
        return
    dist.barrier(group=mpu.get_data_parallel_group())

def shards(mpu, names, weights, t):
    tp_rank = mpu.get_tensor_model_parallel_rank()
    local = {}
    for name in names:
        local[name] = weights[name][tp_rank]  # per-rank values, the same keys
    for name in names:
        if name not in local:
            continue
        dist.all_reduce(t)

def same_dimension(mpu, t):
    if mpu.get_tensor_model_parallel_rank() == 0:  # expect: HC102
        dist.all_reduce(t, group=mpu.get_tensor_model_parallel_group())  # gated
"""
        },
    )


def test_a_callees_fixed_group_is_the_calls_dimension(lint_snippets):
    # The call site names no group; the callee gathers on the pipeline group whoever calls it, so a
    # tensor-parallel rank test around it decides nothing within that group (ColossalAI's
    # checkpointing.py, gather_pipeline_parallel_state_dict). A callee on the world stays a finding; one
    # on a group it is handed is none: nothing shows who holds that group (checks._for).
    check(
        lint_snippets,
        {
            "m.py": """
def gather_pp(mpu, state):
    dist.all_gather_object([None], state, group=mpu.get_pipeline_model_parallel_group())
    sync_pp(mpu, state)

def sync_pp(mpu, state):
    dist.barrier(group=mpu.get_pipeline_model_parallel_group())

def gather_on(state, group):
    dist.all_gather_object([None], state, group=group)

def gather_world(state):
    dist.barrier()

def save(mpu, state, group):
    if mpu.get_tensor_model_parallel_rank() == 0:
        gather_pp(mpu, state)
    if mpu.get_tensor_model_parallel_rank() == 0:  # expect: HC102
        gather_on(state, group)
        gather_world(state)  # gated
"""
        },
    )


def test_a_methods_rank_argument_beside_its_own_rank_is_another_rank(lint_snippets):
    # issue 34: `_add_peers(self, rank, peers)` reads its object's own rank from `self.rank`; its `rank`
    # argument is each rank of the world in turn (a loop in the constructor), so every rank makes every
    # pair's group in the same order: no finding
    check(
        lint_snippets,
        {
            "m.py": """
class PairGroup:
    def __init__(self, master_rank: int, dest: int) -> None:
        self.group = dist.new_group([master_rank, dest])


class PeerGraph:
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.links: list[list[PairGroup]] = [[] for _ in range(world_size)]
        for r in range(world_size):
            self._add_peers(r, [(r + 1) % world_size])

    def _add_peers(self, rank: int, peers: list) -> None:
        for peer in peers:
            if peer not in self.links[rank]:
                self.links[rank].append(PairGroup(self.rank, peer))
"""
        },
    )


def test_free_counts_of_one_pool_are_one_finding_that_cites_the_lagging_free(lint_snippets):
    # issue 34: `available_size()` and `swa_available_size()` of one allocator differ between ranks for
    # one reason (its frees lag on each rank); the finding says where the code makes that premise hold
    report = check(
        lint_snippets,
        {
            "m.py": """
class Scheduler:
    def admit(self, reqs, x):
        for req in reqs:
            if self.allocator.available_size() < req.size:  # expect: HC101
                break
            dist.all_reduce(x)  # gated

    def admit_window(self, x):
        if self.allocator.swa_available_size() < 4:
            dist.broadcast(x, src=0)  # gated
"""
        },
    )
    (f,) = report.findings
    assert f.count == 2 and "here `allocator` changes at m.py:" in f.message
    # line 18: LAGGING_FREES' `allocator.free(pages)`, under its event poll
    assert [r.line for r in f.related if r.role == "source" and r.message.startswith("the premise")] == [18]


def test_a_rank_variable_read_as_a_truth_value_is_how_the_job_was_launched(lint_snippets):
    # NeMo's SageMaker set-up: `os.environ.get("RANK")` is a string, "0" included, on every rank the
    # launcher started; whether it is set is the same everywhere. Its value compared stays a rank id.
    check(
        lint_snippets,
        {
            "m.py": """
import os

def setup():
    if os.environ.get("RANK") and os.environ.get("WORLD_SIZE"):
        dist.init_process_group()
        return dist.barrier()

def leader():
    if not os.getenv("LOCAL_RANK"):
        return
    if os.environ.get("RANK") == "0":  # expect: HC102
        dist.barrier()  # gated
"""
        },
    )


def test_an_arm_that_hands_the_object_over_may_issue_its_collectives(lint_snippets):
    # NeMo's deploy: rank 0 hands the model to a server, which calls its generate() (a broadcast) per
    # request; the other ranks follow in generate_other_ranks(). An arm that neither calls nor hands over
    # the object skips its collectives.
    check(
        lint_snippets,
        {
            "m.py": """
class Model:
    def generate(self, x):
        dist.broadcast(x, src=0)

    def generate_other_ranks(self):
        while True:
            dist.broadcast(torch.zeros(1), src=0)

def deploy(model: Model, Server):
    if dist.get_rank() == 0:
        server = Server(model=model)
        server.serve()
    else:
        model.generate_other_ranks()

def deploy_alone(model: Model, log):
    if dist.get_rank() == 0:  # expect: HC102
        log("serving")
    else:
        model.generate_other_ranks()  # gated
"""
        },
    )


def test_a_strategys_broadcast_result_is_agreed(lint_snippets):
    # Lightning's ModelCheckpoint: a wall-clock decision broadcast from rank 0 through the trainer's
    # strategy is the same on every rank after the call; the raw decision is not.
    check(
        lint_snippets,
        {
            "m.py": """
def on_batch_end(trainer, last, interval):
    skip = time.monotonic() - last < interval
    skip = trainer.strategy.broadcast(skip)
    if skip:
        return
    dist.barrier()

def on_batch_end_raw(trainer, last, interval):
    if time.monotonic() - last < interval:  # expect: HC103
        return
    dist.barrier()  # gated
"""
        },
    )


def test_an_elif_every_other_rank_takes_leaves_no_fall_through(lint_snippets):
    # `if rank == 0: ... elif rank > 0: ...`: every rank takes one of the two arms. The followers' arm is
    # compared with the leader's (which hands the model over), not with an `else` no rank reaches. With a
    # gap (`elif rank > 1`), rank 1 falls through and skips the followers' broadcasts.
    check(
        lint_snippets,
        {
            "m.py": """
class Model:
    def generate_other_ranks(self):
        while True:
            dist.broadcast(torch.zeros(1), src=0)

def deploy(model: Model, Server):
    if dist.get_rank() == 0:
        Server(model=model).serve()
    elif dist.get_rank() > 0:
        model.generate_other_ranks()

def deploy_gap(model: Model, Server):
    if dist.get_rank() == 0:
        Server(model=model).serve()
    elif dist.get_rank() > 1:  # expect: HC102
        model.generate_other_ranks()  # gated
"""
        },
    )


def test_a_value_returned_after_a_guarded_broadcast_is_agreed(lint_snippets):
    # OLMo's synchronize_value: broadcast when torch.distributed is set up, else return the value as it is
    # (one process, nothing to agree with). Rank 0's wall-clock decision comes back agreed; a decision
    # each rank takes on its own clock is the finding.
    check(
        lint_snippets,
        {
            "m.py": """
def synchronize_value(value, device):
    if dist.is_available() and dist.is_initialized():
        t = torch.tensor(value, device=device)
        dist.broadcast(t, 0)
        return t.item()
    else:
        return value

def train(start, limit, device, steps):
    for step in steps:
        cancel = False
        if dist.get_rank() == 0:
            cancel = time.time() - start >= limit
        if synchronize_value(cancel, device):
            break
        dist.all_reduce(step)

def train_unsynchronized(start, limit, steps):
    for step in steps:
        if time.time() - start >= limit:  # expect: HC101
            break
        dist.all_reduce(step)  # gated
"""
        },
    )


def test_a_drivers_call_on_an_interface_does_not_reach_ray_actors(lint_snippets):
    # NeMo-RL: the driver's `policy.train()` on a PolicyInterface sends work to Ray actors; the actors'
    # own `train()` (a @ray.remote subclass of the implementation) runs in their processes, on every
    # worker the driver sends it to. An implementation that is no actor is the driver's own code.
    check(
        lint_snippets,
        {
            "iface.py": """
class PolicyInterface:
    def train(self, batch):
        raise NotImplementedError

class LoggerInterface:
    def publish(self, batch):
        raise NotImplementedError
""",
            "worker.py": """
import ray
from iface import PolicyInterface

class WorkerImpl(PolicyInterface):
    def train(self, batch):
        dist.all_reduce(batch)

@ray.remote(num_gpus=1)
class Worker(WorkerImpl):
    pass
""",
            "local.py": """
from iface import LoggerInterface

class LocalLogger(LoggerInterface):
    def publish(self, batch):
        dist.barrier()
""",
            "driver.py": """
from iface import LoggerInterface, PolicyInterface

def fit(policy: PolicyInterface, batches, start, limit):
    for batch in batches:
        if time.time() - start >= limit:
            return
        policy.train(batch)

def log(logger: LoggerInterface, batches, start, limit):
    for batch in batches:
        if time.time() - start >= limit:  # expect: HC101
            return
        logger.publish(batch)  # gated
""",
        },
    )


def test_a_deadline_returned_to_a_caller_is_not_its_decision(lint_snippets):
    # OLMo's check_if_cancelled, NeMo-RL's TimeoutChecker: the clock is compared in a helper that returns
    # the verdict; on held-out code its callers agreed on it or ran in one process. Compared where the
    # loop decides, it stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
def time_is_up(start, limit):
    return time.time() - start >= limit

def fit(batches, start, limit):
    for batch in batches:
        if time_is_up(start, limit):
            break
        dist.all_reduce(batch)

def fit_inline(batches, start, limit):
    for batch in batches:
        if time.time() - start >= limit:  # expect: HC101
            break
        dist.all_reduce(batch)  # gated
"""
        },
    )


def test_a_clock_read_in_another_function_is_compared_where_it_was_read(lint_snippets):
    # ParlAI's train loop compares times that `_get_time()` returns (synced from rank 0 whenever a limit is
    # set); a decision on a clock read elsewhere is not taken here. A local reading beside it is.
    check(
        lint_snippets,
        {
            "m.py": """
class Loop:
    def _get_time(self):
        return time.time() - self.start

    def train(self, batches):
        for batch in batches:
            train_time = self._get_time()
            if train_time > self.max_train_time:
                break
            dist.all_reduce(batch)

    def train_local(self, batches):
        for batch in batches:
            if time.time() - self.start > self.max_train_time:  # expect: HC101
                break
            dist.all_reduce(batch)  # gated
"""
        },
    )


def test_rank_zero_first_context_manager(lint_snippets):
    # NeMo Automodel's FirstRankPerNode: the other ranks wait in __enter__'s barrier, rank 0 releases them
    # from __exit__'s. A context manager whose __exit__ issues nothing leaves the others waiting.
    check(
        lint_snippets,
        {
            "m.py": """
class FirstRank:
    def __enter__(self):
        self.first = dist.get_rank() == 0
        if not self.first:
            dist.barrier()
        return self.first

    def __exit__(self, *exc):
        if self.first:
            dist.barrier()
        return False


class OnlyWait:
    def __enter__(self):
        if dist.get_rank() != 0:  # expect: HC102
            dist.barrier()  # gated
        return self

    def __exit__(self, *exc):
        return False
"""
        },
    )


def test_a_failures_fallback_value_does_not_set_a_loops_trip_count(lint_snippets):
    # xinference's cosyvoice trainer re-reads its config in the handler; vllm-ascend falls back to the
    # host name's address: the loop then runs over the fallback, as long as what it replaced. A failure
    # that breaks out of the loop stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
def train(path, fallback):
    try:
        epochs = int(open(path).read())
    except OSError:
        epochs = int(open(fallback).read())
    for _ in range(epochs):
        dist.all_reduce(torch.ones(1))

def fetch_all(paths):
    for path in paths:
        try:
            data = open(path).read()  # expect: HC101
        except OSError:
            break
        dist.broadcast(torch.ones(1), src=0)  # gated
"""
        },
    )


def test_a_call_on_a_base_of_dozens_of_implementations_reaches_none_of_them(lint_snippets):
    # ParlAI's `agent.act()` on `Agent` (43 overrides) reached a TorchAgent's fp16 all_reduce from a chat
    # world with no process group: past MAX_OVERRIDES implementations, which one runs is the program's
    # configuration. A base of a few implementations is still followed into each.
    many = "\n".join(f"class Agent{i}(Agent):\n    def act(self):\n        return {i}\n" for i in range(25))
    check(
        lint_snippets,
        {
            "agents.py": "class Agent:\n    def act(self):\n        return None\n\n"
            + many
            + "\nclass TorchAgent(Agent):\n    def act(self):\n        dist.all_reduce(torch.ones(1))\n",
            "few.py": """
class Policy:
    def train_step(self):
        return None

class SyncPolicy(Policy):
    def train_step(self):
        dist.all_reduce(torch.ones(1))
""",
            "world.py": """
from agents import Agent
from few import Policy

def chat(agent: Agent, start, timeout):
    while time.time() - start < timeout:
        agent.act()

def train(policy: Policy, start, timeout):
    while time.time() - start < timeout:  # expect: HC101
        policy.train_step()  # gated
""",
        },
    )


def test_an_elif_on_a_rank_beyond_any_job_is_decided_at_once(lint_snippets):
    # `!= K` then `== K` covers every rank whatever K is; a K past any job's size is not looked at rank by
    # rank (the check would count up to it): the elif stays a branch of its own.
    check(
        lint_snippets,
        {
            "m.py": """
def f():
    if dist.get_rank() != 1000000000000:  # expect: HC102
        pass
    elif dist.get_rank() == 1000000000000:  # expect: HC102
        dist.barrier()  # gated
"""
        },
    )


def test_a_progress_bar_on_one_rank_iterates_the_same_items(lint_snippets):
    # DiT's sample_ddp.py (copied into SiT and others): `pbar = tqdm(pbar) if rank == 0 else pbar`, a barrier
    # each turn: every rank runs the same turns, rank 0 with a bar. A slice on one rank does not.
    check(
        lint_snippets,
        {
            "m.py": """
from tqdm import tqdm

def sample(iterations):
    rank = dist.get_rank()
    pbar = range(iterations)
    pbar = tqdm(pbar) if rank == 0 else pbar
    for i in pbar:
        dist.barrier()

def sample_twin(iterations):
    rank = dist.get_rank()  # expect: HC101
    pbar = range(iterations)
    pbar = pbar[:1] if rank == 0 else pbar
    for i in pbar:
        dist.barrier()  # gated
"""
        },
    )


def test_a_pool_freed_only_under_another_findings_source_is_that_findings_consequence(lint_snippets):
    # SGLang's host pool: the waiting-timeout abort (a per-rank deadline) releases a request, which frees host
    # pages and itself issues a barrier; the free count then gates an all_reduce elsewhere. One root cause,
    # the deadline: the pool's gated collective is related to it, not a premise finding of its own. A pool
    # whose free runs under a poll that gates no collective stays a finding with its premise.
    report = check(
        lint_snippets,
        {
            "m.py": """
class Scheduler:
    def abort(self, req):
        self.host_pool.free(req.pages)
        dist.barrier()

    def check_timeouts(self, reqs):
        deadline = time.monotonic() - 30
        for req in reqs:
            if req.entry_time < deadline:  # expect: HC102
                self.abort(req)  # gated

    def prefetch(self, keys):
        if self.host_pool.available_size() < len(keys):
            return 0
        hits = torch.tensor([len(keys)])
        dist.all_reduce(hits)  # gated
        return int(hits.item())

    def drain(self, done):
        if done.query():
            self.spare_pool.free(done.pages)

    def load(self, keys):
        if self.spare_pool.available_size() < len(keys):  # expect: HC103
            return 0
        dist.all_reduce(torch.ones(1))  # gated
"""
        },
    )
    by_line = {f.rule: f for f in report.findings}
    assert by_line["HC102"].premise is None and by_line["HC102"].count == 2
    assert any("through what it changes" in r.message for r in by_line["HC102"].related)
    assert by_line["HC103"].premise is not None


def test_a_failures_fallback_value_made_into_another_value_is_data(lint_snippets):
    # GLIP's checkpointer: a `last_checkpoint` file that fails to open falls back to "", which
    # `os.path.join(save_dir, ...)` makes a path again; `if not f: return` ahead of the load's barrier reads
    # that path, not whether the read failed. A handler that returns a verdict (SGLang's presharded
    # checksum check, judged real) stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
import os

class Checkpointer:
    def last_file(self):
        try:
            with open(os.path.join(self.save_dir, "last_checkpoint")) as fh:
                return fh.read().strip()
        except IOError:
            return ""

    def load(self):
        f = os.path.join(self.save_dir, self.last_file())
        if not f:
            return {}
        dist.barrier()

    def matches(self, path):
        try:
            with open(path) as fh:  # expect: HC103
                return fh.read() == "ok"
        except OSError:
            return False

    def load_checked(self, path):
        if not self.matches(path):
            return {}
        dist.barrier()  # gated
"""
        },
    )

"""A rank-dependent branch whose every path to the function's exit issues the same collectives
(paths.py) is no divergence; its twins, whose paths really differ, stay findings. Also a rank id of
one parallel dimension deciding a collective on a group of another (checks._other_dimension)."""

from __future__ import annotations

from .test_rules import check


def test_barrier_before_and_after_yield_is_one_barrier_each(lint_snippets):
    # Ranks other than the executor wait before the body, the executor after it: one barrier each.
    check(
        lint_snippets,
        {
            "m.py": """
from contextlib import contextmanager

@contextmanager
def priority_execution(executor_rank=0, group=None):
    rank = dist.get_rank(group=group)
    should_block = rank != executor_rank
    if should_block:
        dist.barrier(group=group)
    yield
    if not should_block:
        dist.barrier(group=group)
"""
        },
    )


def test_barrier_before_yield_on_one_side_only_stays(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
from contextlib import contextmanager

@contextmanager
def priority_execution(executor_rank=0, group=None):
    rank = dist.get_rank(group=group)  # expect: HC102
    should_block = rank != executor_rank
    if should_block:
        dist.barrier(group=group)  # gated
    yield
    if should_block:
        dist.barrier(group=group)  # gated
"""
        },
    )


def test_barrier_and_return_ahead_of_the_one_later_barrier(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
def save(rank, pp_size, write, group):
    if rank != 0:
        dist.barrier(group=group)
        return
    if pp_size == 1:
        write()
    dist.barrier(group=group)
    if rank == 0:
        write()

def roles(src, inputs, out, group):
    if dist.get_rank() == src:
        parts = [inputs.clone() for _ in range(4)]
        dist.gather(inputs, parts, dst=src, group=group)
        dist.scatter(out, parts, src=src, group=group)
    else:
        dist.gather(inputs, dst=src, group=group)
        dist.scatter(out, src=src, group=group)
    return out
"""
        },
    )


def test_barrier_and_return_ahead_of_two_later_barriers_stays(lint_snippets):
    check(
        lint_snippets,
        {
            "m.py": """
def save(pp_size, write):
    rank = dist.get_rank()  # expect: HC102
    if rank != 0:
        dist.barrier()  # gated
        return
    if pp_size == 1:
        dist.barrier()  # gated
    dist.barrier()  # gated

def other_group(write, tp_group, dp_group):
    if dist.get_rank() != 0:  # expect: HC102
        dist.barrier(group=tp_group)  # gated
        return
    dist.barrier(group=dp_group)  # gated
"""
        },
    )


def test_rank_of_another_dimension_2p5d(lint_snippets):
    # 2.5D: the depth ("dep") rank is the same on every rank of one row group, and row and column
    # ranks are the same on every rank of one depth group.
    check(
        lint_snippets,
        {
            "m.py": """
class ParallelMode:
    PARALLEL_2P5D_ROW = "row"
    PARALLEL_2P5D_COL = "col"
    PARALLEL_2P5D_DEP = "dep"

def save(gpc, state):
    if gpc.get_local_rank(ParallelMode.PARALLEL_2P5D_DEP) == 0:
        dist.all_reduce(state, group=gpc.get_group(ParallelMode.PARALLEL_2P5D_ROW))
        if gpc.get_local_rank(ParallelMode.PARALLEL_2P5D_ROW) == 0:
            dist.all_reduce(state, group=gpc.get_group(ParallelMode.PARALLEL_2P5D_COL))
    col, row = gpc.get_local_rank(ParallelMode.PARALLEL_2P5D_COL), gpc.get_local_rank(ParallelMode.PARALLEL_2P5D_ROW)
    if col == 0 and row == 0:
        dist.broadcast(state, 0, group=gpc.get_group(ParallelMode.PARALLEL_2P5D_DEP))
"""
        },
    )


def test_rank_of_the_same_dimension_beside_another_stays(lint_snippets):
    # The row rank beside the depth rank decides a row-group collective: a finding of the row rank,
    # whichever of the two the condition names first.
    check(
        lint_snippets,
        {
            "m.py": """
class ParallelMode:
    PARALLEL_2P5D_ROW = "row"
    PARALLEL_2P5D_DEP = "dep"

def save(gpc, state):
    dep = gpc.get_local_rank(ParallelMode.PARALLEL_2P5D_DEP)
    row = gpc.get_local_rank(ParallelMode.PARALLEL_2P5D_ROW)  # expect: HC102
    if dep == 0 and row == 0:
        dist.all_reduce(state, group=gpc.get_group(ParallelMode.PARALLEL_2P5D_ROW))  # gated
"""
        },
    )


def test_paths_compare_only_collectives_of_the_deciding_ranks_dimension(lint_snippets):
    # ColossalAI's MoE save: ranks other than 0 of one dimension wait in the one world barrier and
    # return; every other path reaches one world barrier too, one of them after a pipeline-group gather
    # that every member of that pipeline group (all of one tensor-parallel rank) issues alike. The twin
    # whose extra collective is on the tensor-parallel group itself stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
def gather_pp(mpu, state):
    dist.all_gather_object([None], state, group=mpu.get_pipeline_model_parallel_group())

def save(mpu, state, use_async):
    tp_rank = mpu.get_tensor_model_parallel_rank()
    if tp_rank != 0:
        dist.barrier()
        return
    if use_async:
        gather_pp(mpu, state)
    dist.barrier()

def save_twin(mpu, state, use_async):
    tp_rank = mpu.get_tensor_model_parallel_rank()  # expect: HC102
    if tp_rank != 0:
        dist.barrier()  # gated
        return
    if use_async:
        dist.all_reduce(state, group=mpu.get_tensor_model_parallel_group())  # gated
    dist.barrier()  # gated
"""
        },
    )


def test_a_return_does_not_skip_a_collective_of_another_arm(lint_snippets):
    # NeMo's deploy(): the in-framework backend's rank 0 returns on a failed start; the trtllm backend's
    # all_gather sits in the `elif`, which that rank never takes: the return skips nothing there. The
    # all_reduce after the whole `if` is skipped, and stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
def deploy(backend, start):
    if backend == "in-framework":
        if dist.get_rank() == 0:  # expect: HC103
            if not start():
                return
    elif backend == "trtllm":
        dist.all_gather_object([None], backend)
    dist.all_reduce(torch.ones(1))  # gated
"""
        },
    )


def test_a_handler_that_raises_leaves_the_barriers_matched(lint_snippets):
    # OLMo-core's HF conversion: rank 0 issues one barrier on each way out (an early return, a handler
    # that raises, or falling through to the barrier every rank reaches). A handler that swallows the
    # failure and falls through issues a second barrier on that path: still a finding.
    check(
        lint_snippets,
        {
            "m.py": """
def convert(config, write):
    if dist.get_rank() == 0:
        if config is None:
            dist.barrier()
            return
        try:
            write(config)
        except Exception:
            dist.barrier()
            raise
    dist.barrier()

def convert_swallowing(config, write):
    if dist.get_rank() == 0:  # expect: HC102
        try:
            write(config)
        except Exception:
            dist.barrier()  # gated
    dist.barrier()
"""
        },
    )


def test_a_comparison_and_its_negation_are_one_condition(lint_snippets):
    # ignite's one_rank_first: `if current_rank != rank: barrier()` before the yield, `if current_rank ==
    # rank: barrier()` after it: one barrier each. Testing the same comparison twice stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
from contextlib import contextmanager

@contextmanager
def one_rank_first(rank=0):
    current_rank = dist.get_rank()
    if current_rank != rank:
        dist.barrier()
    yield
    if current_rank == rank:
        dist.barrier()

@contextmanager
def both_wait(rank=0):
    current_rank = dist.get_rank()  # expect: HC102
    if current_rank != rank:
        dist.barrier()  # gated
    yield
    if current_rank != rank:
        dist.barrier()  # gated
"""
        },
    )


def test_a_finally_after_the_yield_is_followed(lint_snippets):
    # LLaMA-Factory's main_process_first: the others' barrier before the yield inside `try:`, the main
    # rank's in the `finally:` (one barrier each). A `return` inside such a `try` runs the `finally` on
    # its way out, which the path comparison does not model: that twin stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
from contextlib import contextmanager

@contextmanager
def main_process_first():
    is_main_process = dist.get_rank() == 0
    try:
        if not is_main_process:
            dist.barrier()
        yield
    finally:
        if is_main_process:
            dist.barrier()

@contextmanager
def main_process_first_returning(skip):
    is_main_process = dist.get_rank() == 0  # expect: HC102
    try:
        if not is_main_process:
            dist.barrier()  # gated
            if skip:
                return
        yield
    finally:
        if is_main_process:
            dist.barrier()  # gated
"""
        },
    )


def test_a_group_is_named_by_the_last_name_of_its_path(lint_snippets):
    # lighteval's nanotron model: the pipeline-stage rank (`pp_pg`, reached through `parallel_context`,
    # which names no context-parallel group) decides tensor- and data-parallel gathers, whose members all
    # share one stage; the gather helper fills its own default group. The rank within the very group
    # gathered on stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
class Model:
    def gather(self, out, process_group=None):
        if process_group is None:
            process_group = self.parallel_context.dp_pg
        dist.all_gather([out], out, group=process_group)

    def step(self, out):
        if dist.get_rank(self.parallel_context.pp_pg) == self.output_pp_rank:
            dist.all_gather([out], out, group=self.parallel_context.tp_pg)
            self.gather(out)

    def step_twin(self, out):
        if dist.get_rank(self.parallel_context.dp_pg) == 0:  # expect: HC102
            self.gather(out)  # gated
"""
        },
    )


def test_tests_of_one_local_rank_against_constants_take_agreeing_arms(lint_snippets):
    # YOLOv5's torch_distributed_zero_first: local ranks other than -1 and 0 wait before the yield, local
    # rank 0 after it; -1 is a run without torchrun (one process). `device_ids` says how a barrier runs,
    # not which one it is. The twin that releases the wrong rank, and the twin on a rank that is not a
    # local rank (-1 can be a rank outside a weight-sync group: fp_group_joined_after_exit.py), stay.
    check(
        lint_snippets,
        {
            "m.py": """
from contextlib import contextmanager

@contextmanager
def torch_distributed_zero_first(local_rank: int):
    if local_rank not in [-1, 0]:
        dist.barrier(device_ids=[local_rank])
    yield
    if local_rank == 0:
        dist.barrier(device_ids=[0])

@contextmanager
def releases_rank_one(local_rank: int):
    if local_rank not in [-1, 0]:
        dist.barrier(device_ids=[local_rank])
    yield
    if local_rank == 1:  # expect: HC102
        dist.barrier(device_ids=[0])  # gated

@contextmanager
def zero_first_by_global_rank(rank: int):
    if rank not in [-1, 0]:
        dist.barrier()
    yield
    if rank == 0:  # expect: HC102
        dist.barrier()  # gated
"""
        },
    )


def test_rank_zero_first_across_repeated_rank_calls_and_fixed_flags(lint_snippets):
    # DeepSpeedExamples' CIFAR set-up and HF's run_squad (in bagua's examples): `if flag and get_rank() != 0:
    # barrier()` ahead of the work, `if flag and get_rank() == 0: barrier()` after it. Each rank asks the
    # group again (one answer per run); the flag and `evaluate` hold the same on every rank, so with them
    # off nobody waits and with them on everybody waits once. FastChat's: rank 0 makes the file the others
    # then find; a rank that does not find it fails an assert. Twins: a flag assigned in between, and a
    # rank released by the wrong test, stay findings.
    check(
        lint_snippets,
        {
            "m.py": """
import os

def cifar(args):
    if dist.get_rank() != 0:
        dist.barrier()
    download(args)
    if dist.get_rank() == 0:
        dist.barrier()

def squad(args, evaluate=False):
    if args.distributed and dist.get_rank() != 0 and not evaluate:
        dist.barrier()
    if os.path.exists(args.cache) and not args.overwrite_cache:
        features = load(args.cache)
    else:
        features = build(args)
    if args.distributed and dist.get_rank() == 0 and not evaluate:
        dist.barrier()
    return features

def fastchat(path):
    if dist.get_rank() != 0:
        dist.barrier()
    if os.path.exists(path):
        data = load(path)
        if dist.get_rank() == 0:
            dist.barrier()
    else:
        assert dist.get_rank() == 0
        data = build(path)
        dist.barrier()
    return data

def flag_changed(cfg):
    if cfg.enabled and dist.get_rank() != 0:  # expect: HC102
        dist.barrier()  # gated
    cfg.enabled = False
    if cfg.enabled and dist.get_rank() == 0:  # expect: HC102
        dist.barrier()  # gated

def wrong_release(args):
    if dist.get_rank() != 0:  # expect: HC102
        dist.barrier()  # gated
    download(args)
    if dist.get_rank() == 1:  # expect: HC102
        dist.barrier()  # gated
"""
        },
    )


def test_a_turn_whose_every_path_gathers_once(lint_snippets):
    # modded-nanogpt's sharded optimizer: the rank that owns a fresh parameter gathers and `continue`s; every
    # other rank gathers at the end of the turn: one all_gather per turn on every rank. The twin whose
    # `continue` skips the gather stays.
    check(
        lint_snippets,
        {
            "m.py": """
def step(params, state, world_size):
    rank = dist.get_rank()
    for base_i in range(0, len(params), world_size):
        if base_i + rank < len(params):
            p = params[base_i + rank]
            if len(state[p]) == 0:
                init(state[p])
                dist.all_gather(params[base_i:base_i + world_size], params[base_i + rank])
                continue
            update(p)
        dist.all_gather(params[base_i:base_i + world_size], params[base_i + rank])

def step_twin(params, state, world_size):
    rank = dist.get_rank()  # expect: HC101
    for base_i in range(0, len(params), world_size):
        if base_i + rank < len(params):
            p = params[base_i + rank]
            if len(state[p]) == 0:
                init(state[p])
                continue
            update(p)
        dist.all_gather(params[base_i:base_i + world_size], params[base_i + rank])  # gated
"""
        },
    )


def test_a_loop_every_path_runs_after_the_branch_is_one_token(lint_snippets):
    # EDM's FID: rank 0 loads the detector first, then every rank runs the batch loop with its barrier. The
    # twin whose rank 0 alone sets how many batches the loop runs stays a finding.
    check(
        lint_snippets,
        {
            "m.py": """
def fid(loader, detector_url):
    if dist.get_rank() != 0:
        dist.barrier()
    net = load(detector_url)
    if dist.get_rank() == 0:
        dist.barrier()
    for images in loader:
        dist.barrier()
        net(images)

def fid_twin(loader, detector_url):
    batches = loader
    if dist.get_rank() != 0:  # expect: HC102
        dist.barrier()  # gated
    net = load(detector_url)
    if dist.get_rank() == 0:  # expect: HC102
        batches = loader[:1]
        dist.barrier()  # gated
    for images in batches:
        dist.barrier()
        net(images)
"""
        },
    )

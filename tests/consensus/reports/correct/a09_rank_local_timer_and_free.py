# EXPECT: verdict=consistent
# SOURCE: rawbby/KaSpan scc/include/kaspan/mpi_basic/allreduce_max_time.hpp (per-rank time reduced with MAX, MPI idiom); https://github.com/NVIDIA-NeMo/Speech/pull/637 (per-rank value reduced with MAX)
# SHAPE: each rank measures a different elapsed time and a different free-slot count and reduces them (MAX and SUM), so the inputs are rank-dependent, but both reductions are issued by all ranks from the same lines in the same order.
# RUN: torchrun --standalone --nproc-per-node 2 a09_rank_local_timer_and_free.py
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()

t0 = time.perf_counter()
time.sleep(0.05 * (rank + 1))  # rank 1 is the straggler
elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
free_slots = torch.tensor([17 - 5 * rank], dtype=torch.int64)  # rank-local bookkeeping

dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # slowest rank decides the reported time
dist.all_reduce(free_slots, op=dist.ReduceOp.SUM)  # cluster-wide free count

assert elapsed.item() >= 0.05 * world - 1e-3, elapsed
assert free_slots.item() == sum(17 - 5 * r for r in range(world)), free_slots
print(f"rank {rank}: max step time {elapsed.item():.3f}s, free slots {free_slots.item()}: OK", flush=True)

dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)

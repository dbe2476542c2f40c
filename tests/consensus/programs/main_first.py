"""The "main process first" barriers of transformers' examples
(`load_and_cache_examples`): the other ranks wait at one barrier line while rank 0
builds the dataset cache, then rank 0 releases them from another line. The two
barriers pair by design. Misuse (the default): rank 0's rank-0-only evaluation
loads its data without `evaluate=True`, so it calls the release barrier once
more; it pairs with the peers' final barrier and leaves rank 0 waiting alone.
Correct program: PROG_FIX=1."""

import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import torch.distributed as dist  # noqa: E402
from common import fixed, finish, init, ones  # noqa: E402

rank, world = init()


def load_and_cache_examples(split: str, evaluate: bool = False) -> list[int]:
    if rank != 0 and not evaluate:  # only rank 0 builds the cache; the others read it after
        dist.barrier()  # SITE:wait
    examples = list(range(len(split)))
    if rank == 0 and not evaluate:
        dist.barrier()  # SITE:release
    return examples


def evaluate() -> None:
    load_and_cache_examples("dev", evaluate=fixed())  # SITE:evalload


train = load_and_cache_examples("train")  # SITE:trainload
for step in range(3):
    dist.all_reduce(ones(4))  # SITE:step
if rank == 0:
    evaluate()
dist.barrier()  # SITE:final
finish()

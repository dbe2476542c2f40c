"""One TP rank of the model-equivalence test: `python tests/engine/engine_tp_worker.py OUT_DIR [cpu|cuda]`
started with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

It runs the same fixed cases as the in-process TP=1 run of tests/engine/test_engine_model.py
(`compute_cases`) and saves its logits to OUT_DIR/logits_rank<R>.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.mem_cache.memory_pool import KVPool  # noqa: E402
from engine.model_executor.model import ForwardItem, TinyTransformer  # noqa: E402
from engine.server_args import ModelConfig  # noqa: E402

PAGE = 16


def prompts() -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(1234)
    return {name: torch.randint(1, 30000, (n,), generator=g).tolist() for name, n in (("a", 37), ("b", 64), ("c", 100))}


def compute_cases(model: TinyTransformer, device: torch.device) -> dict[str, torch.Tensor]:
    """Logits of: a batch of three full prefills; the longest prompt prefilled in two
    steps (48 cached tokens, then the rest); one decode step after that."""
    cfg = model.cfg
    heads = cfg.num_heads // model.tp_size
    pool = KVPool(64, PAGE, cfg.num_layers, heads, cfg.head_dim, device)
    ps = prompts()
    out: dict[str, torch.Tensor] = {}

    def slots(first_page: int, n_tokens: int) -> torch.Tensor:
        pages = list(range(first_page, first_page + -(-n_tokens // PAGE)))
        return pool.page_slots(pages)[:n_tokens].to(device)

    # 1. batch of full prefills (pages 0.., 10.., 20..)
    items = [ForwardItem(ps[k], 0, slots(10 * i, len(ps[k]))) for i, k in enumerate("abc")]
    out["full"] = model.forward(items, pool).float().cpu()
    # 2. prompt c again in fresh pages: a 48-token prefix first, then the rest reading the cached prefix
    c, s = ps["c"], slots(40, len(ps["c"]) + 1)
    out["prefix_part"] = model.forward([ForwardItem(c[:48], 0, s[:48])], pool).float().cpu()
    out["prefix_rest"] = model.forward([ForwardItem(c[48:], 48, s[: len(c)])], pool).float().cpu()
    # the same suffix over never-written pages: what a lost prefix would give
    blank = slots(50, len(c))
    out["rest_without_prefix"] = model.forward([ForwardItem(c[48:], 48, blank)], pool).float().cpu()
    # 3. one decode step after the two-step prefill, batched with prompt a's decode
    tok_c = int(out["prefix_rest"][0].argmax())
    tok_a = int(out["full"][0].argmax())
    out["decode"] = (
        model.forward(
            [
                ForwardItem([tok_c], len(c), s[: len(c) + 1]),
                ForwardItem([tok_a], len(ps["a"]), slots(0, len(ps["a"]) + 1)),
            ],
            pool,
        )
        .float()
        .cpu()
    )
    return out


def main() -> None:
    import torch.distributed as dist

    out_dir = Path(sys.argv[1])
    kind = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    if kind == "cuda":
        device = torch.device(f"cuda:{rank}")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    model = TinyTransformer(ModelConfig(), rank, world, device, group=dist.group.WORLD)
    result = compute_cases(model, device)
    torch.save(result, out_dir / f"logits_rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()


def run_tp_workers(out_dir: Path, world: int = 2, kind: str = "cpu", timeout: float = 180.0) -> list[dict]:
    """Start `world` real rank processes (fresh interpreters, torchrun env), wait with a
    deadline, reap them, and return each rank's saved logits."""
    import time

    from hctool.supervise.procs import ProcessSet, free_port, python_cmd, torchrun_env

    port = free_port()
    with ProcessSet() as procs:
        for r in range(world):
            env = {**os.environ, **torchrun_env(r, world, "127.0.0.1", port), "PYTHONUNBUFFERED": "1"}
            procs.start(
                f"rank {r}", python_cmd(__file__, str(out_dir), kind), env=env, log_path=out_dir / f"rank{r}.log"
            )
        finished = procs.wait_all(time.monotonic() + timeout)
        codes = [c.popen.returncode for c in procs.children]
    logs = "\n".join((out_dir / f"rank{r}.log").read_text(errors="replace")[-2000:] for r in range(world))
    assert finished, f"TP workers did not finish in {timeout} s:\n{logs}"
    assert codes == [0] * world, f"TP workers exited with {codes}:\n{logs}"
    return [torch.load(out_dir / f"logits_rank{r}.pt") for r in range(world)]

"""SGLang: srt/model_executor/model_runner.py.

Owns the model and the memory pools it runs over (as SGLang's ModelRunner
does): the request -> token table, the L1 page allocator and the L1 KV pool.
`forward` runs one batch and samples one token per request.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.mem_cache.memory_pool import KVPool, PagedAllocator, ReqToTokenPool
from engine.model_executor.model import ForwardItem, TinyTransformer
from engine.server_args import ServerArgs


class ModelRunner:
    def __init__(self, args: ServerArgs, tp_rank: int, tp_size: int, device: torch.device, group=None):
        cfg, p = args.model, args.page_size
        self.device = device
        # The model's all_reduces use `group` (default: the default group, NCCL on cuda).
        self.model = TinyTransformer(cfg, tp_rank, tp_size, device, group=group, pad_tokens=args.pad_forward_tokens)
        num_pages = args.max_total_tokens // p
        self.req_to_token_pool = ReqToTokenPool(args.max_running_requests, num_pages * p, device)
        self.token_to_kv_pool_allocator = PagedAllocator(num_pages, p, "device")
        self.kv_pool = KVPool(num_pages, p, cfg.num_layers, cfg.num_heads // tp_size, cfg.head_dim, device)

    def forward(
        self, items: list[ForwardItem], reqs: list, wait_layer: Callable[[int], None] | None = None
    ) -> list[int]:
        """One forward over `items` (one per request of `reqs`), then one sampled
        token per request (seeded per request, so every rank draws the same)."""
        logits = self.model.forward(items, self.kv_pool, wait_layer=wait_layer)
        return self.model.sample(logits, [r.temperature for r in reqs], [r.generator for r in reqs])

    def write_req_to_token(self, req_pool_idx: int, pages: list[int]) -> None:
        slots = self.kv_pool.page_slots(pages).to(self.device)
        self.req_to_token_pool.req_to_token[req_pool_idx, : len(slots)] = slots

    def token_slots(self, req_pool_idx: int, length: int) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token[req_pool_idx, :length]

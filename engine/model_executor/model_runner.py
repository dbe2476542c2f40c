"""SGLang: srt/model_executor/model_runner.py.

Owns the model and the memory pools it runs over (as SGLang's ModelRunner
does): the request -> token table, the L1 page allocator and the L1 KV pool.
`forward` runs one batch and samples one token per request.

Under PP (SGLang's PPProxyTensors) a stage runs its layers only: the batch is cut into
micro-batches, each stage receives a micro-batch's hidden states from the previous stage
over the pp group (p2p), runs it, and sends it on without waiting for the next stage, so
stage 0 computes micro-batch k+1 while stage 1 computes k; the last stage samples and its
next token ids go to every stage, whose schedulers all append them. Under DP (SGLang's DP
attention, vLLM's coordinate_batch_across_dp) every step of every replica starts with one
collective that tells each replica every replica's token count: it sizes the MLP's gather,
and a replica with nothing to run joins with an idle step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from engine.mem_cache.memory_pool import KVPool, PagedAllocator, ReqToTokenPool
from engine.model_executor.model import ForwardItem, TinyTransformer
from engine.server_args import ServerArgs


class ModelRunner:
    def __init__(self, args: ServerArgs, tp_rank: int, tp_size: int, device: torch.device, group=None, parallel=None):
        cfg, p = args.model, args.page_size
        self.device = device
        self.parallel = parallel
        pp_rank, pp_size = (parallel.pp_rank, parallel.pp_size) if parallel is not None else (0, 1)
        self.pp_size, self.dp_size = pp_size, parallel.dp_size if parallel is not None else 1
        dp = None
        if self.dp_size > 1:
            dp = (parallel.dp_rank, parallel.dp_size, parallel.dp_cpu_group, parallel.mlp_group)
        # The model's all_reduces use `group` (default: the default group, NCCL on cuda).
        self.model = TinyTransformer(
            cfg, tp_rank, tp_size, device, group=group, pad_tokens=args.pad_forward_tokens,
            pp_rank=pp_rank, pp_size=pp_size, dp=dp,
        )  # fmt: skip
        num_pages = args.max_total_tokens // p
        self.req_to_token_pool = ReqToTokenPool(args.max_running_requests, num_pages * p, device)
        self.token_to_kv_pool_allocator = PagedAllocator(num_pages, p, "device")
        layers = len(self.model.layers)  # this stage's: its pools hold its layers' KV only
        self.kv_pool = KVPool(num_pages, p, layers, cfg.num_heads // tp_size, cfg.head_dim, device)
        self.forward_count = 0  # DP: whether this tick ran a forward (else the idle step)

    def forward(
        self, items: list[ForwardItem], reqs: list, wait_layer: Callable[[int], None] | None = None
    ) -> list[int]:
        """One forward over `items` (one per request of `reqs`), then one sampled
        token per request (seeded per request, so every rank draws the same)."""
        self.forward_count += 1
        if self.pp_size > 1:
            return self.forward_pp(items, reqs, wait_layer)
        dp_num_tokens = None
        if self.dp_size > 1:
            dp_num_tokens = coordinate_batch_across_dp(sum(len(it.input_ids) for it in items), self.parallel)
        logits = self.model.forward(items, self.kv_pool, wait_layer=wait_layer, dp_num_tokens=dp_num_tokens)
        return self.model.sample(logits, [r.temperature for r in reqs], [r.generator for r in reqs])

    def forward_idle(self) -> None:
        """DP: this replica has no tokens this step while another has (SGLang's IDLE forward
        mode, vLLM's _dummy_run): it still joins coordinate_batch_across_dp and every layer's
        MLP gather and reduce, with no rows of its own."""
        dp_num_tokens = coordinate_batch_across_dp(0, self.parallel)
        if max(dp_num_tokens) > 0:
            self.model.forward([], self.kv_pool, dp_num_tokens=dp_num_tokens)

    # -- pipeline parallel ---------------------------------------------------------------
    def forward_pp(self, items: list[ForwardItem], reqs: list, wait_layer) -> list[int]:
        ps = self.parallel
        n = len(items)
        cuts = [n * k // min(self.pp_size, n) for k in range(min(self.pp_size, n) + 1)]
        micro_batches = [items[a:b] for a, b in zip(cuts, cuts[1:])]
        sends, logits = [], []
        for mb_id, mb in enumerate(micro_batches):
            hidden = None if ps.is_first_stage else self.recv_proxy_tensors(mb, mb_id)
            out = self.model.forward(mb, self.kv_pool, wait_layer=wait_layer, hidden=hidden)
            if ps.is_last_stage:
                logits.append(out)
            else:  # on to the next stage; this stage goes on with the next micro-batch
                sends.append(dist.isend(out.contiguous().cpu(), ps.stage_rank(ps.pp_rank + 1), ps.pp_group, mb_id))
        for work in sends:
            work.wait()
        next_ids = torch.zeros(n, dtype=torch.int64)
        if ps.is_last_stage:
            sampled = self.model.sample(torch.cat(logits), [r.temperature for r in reqs], [r.generator for r in reqs])
            next_ids = torch.tensor(sampled, dtype=torch.int64)
        # Every stage's scheduler appends the same tokens (SGLang relays pp_outputs stage to stage).
        dist.broadcast(next_ids, ps.stage_rank(ps.pp_size - 1), group=ps.pp_group)
        return [int(t) for t in next_ids.tolist()]

    def recv_proxy_tensors(self, mb: list[ForwardItem], mb_id: int) -> torch.Tensor:
        """The previous stage's hidden states of micro-batch mb_id, into a buffer sized by this
        stage's own batch: its extend lengths must be the ones the previous stage ran."""
        ps = self.parallel
        hidden = torch.empty(sum(len(it.input_ids) for it in mb), self.model.cfg.hidden_size)
        dist.recv(hidden, ps.stage_rank(ps.pp_rank - 1), ps.pp_group, mb_id)
        return hidden

    def write_req_to_token(self, req_pool_idx: int, pages: list[int]) -> None:
        slots = self.kv_pool.page_slots(pages).to(self.device)
        self.req_to_token_pool.req_to_token[req_pool_idx, : len(slots)] = slots

    def token_slots(self, req_pool_idx: int, length: int) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token[req_pool_idx, :length]


def coordinate_batch_across_dp(num_tokens: int, parallel) -> list[int]:
    """vLLM's coordinate_batch_across_dp (SGLang: prepare_mlp_sync_batch's global_num_tokens):
    every replica's token count this step, by one SUM all_reduce of a one-hot vector over the
    DP group. Every replica must call it once per step it takes part in; one that skips it
    leaves its peers' call to pair with whatever it issues next (vLLM #28774: '8 vs 4')."""
    t = torch.zeros(parallel.dp_size, dtype=torch.int64)
    t[parallel.dp_rank] = num_tokens
    dist.all_reduce(t, group=parallel.dp_cpu_group)
    return [int(x) for x in t.tolist()]

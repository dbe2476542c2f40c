"""SGLang: srt/managers/schedule_batch.py (Req).

A request as every rank holds it: identical on every rank, because it is built
from the broadcast input and changed only by the replicated schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.managers.io_struct import SamplingParams, TokenizedGenerateReqInput
from engine.mem_cache.radix_cache import TreeNode


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    pages: list[int] = field(default_factory=list)  # L1 pages of positions [0, kv_len)
    tree_pages: int = 0  # leading pages owned by the tree (locked via last_node)
    last_node: TreeNode | None = None
    kv_len: int = 0
    cached: dict | None = None  # cached_tokens_details at first admission
    generator: torch.Generator | None = None
    finished: bool = False
    bootstrap_room: int | None = None  # PD: where this request's KV travels
    wait_start: float = 0.0  # this rank's wall clock when the request was queued

    @classmethod
    def from_input(cls, msg: TokenizedGenerateReqInput) -> Req:
        sp = msg.sampling_params
        req = cls(msg.rid, list(msg.input_ids), sp, bootstrap_room=msg.bootstrap_room)
        if sp.temperature > 0:  # seeded by the rid, so every rank draws the same tokens
            seed = int.from_bytes(msg.rid.encode()[:8].ljust(8, b"\0"), "little") & 0x7FFFFFFF
            req.generator = torch.Generator().manual_seed(seed)
        return req

    @property
    def max_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens

    @property
    def temperature(self) -> float:
        return float(self.sampling_params.temperature)

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def remaining_tokens(self) -> int:
        return self.max_new_tokens - len(self.output_ids)

"""SGLang: srt/managers/schedule_policy.py.

Admission policy: pure arithmetic over budgets, no torch and no collectives.

The budgets come from rank-local free counts (as in SGLang), so two ranks may
admit different numbers of requests; the scheduler agrees on the count with a
MIN all_reduce after the admission loop, and nothing inside the loop may issue
a collective (SGLang #30760 is what happens when one does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto


class AddReqResult(Enum):
    CAN_RUN = auto()
    NO_TOKEN = auto()  # out of KV budget: the batch is full


def ceil_pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


@dataclass
class PrefillAdder:
    page_size: int
    rem_total_tokens: int  # L1 tokens free now + evictable - reserved for running decodes
    rem_input_tokens: int  # tokens one prefill batch may compute
    can_run_list: list = field(default_factory=list)

    def add_one_req(
        self, req, extend_tokens: int, load_tokens: int, reserve_tokens: int, lock_tokens: int = 0
    ) -> AddReqResult:
        """extend_tokens: to compute; load_tokens: to load back from host;
        reserve_tokens: decode tokens the request may still produce;
        lock_tokens: its cached prefix, evictable now, locked once it runs."""
        need = ceil_pages(extend_tokens + load_tokens + reserve_tokens, self.page_size) * self.page_size + lock_tokens
        if need > self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if extend_tokens > self.rem_input_tokens and self.can_run_list:
            return AddReqResult.NO_TOKEN  # an oversize prompt still runs alone
        self.rem_total_tokens -= need
        self.rem_input_tokens -= extend_tokens
        self.can_run_list.append(req)
        return AddReqResult.CAN_RUN

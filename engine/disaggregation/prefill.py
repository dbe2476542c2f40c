"""SGLang: srt/disaggregation/prefill.py (SchedulerDisaggregationPrefillMixin).

The prefill server: every rank runs the normal prefill; then, instead of
decoding, each rank copies its heads' K/V of the prompt and the first output
token out of the pool and hands them to its KV sender, and the request finishes
here with that one token. Rank 0 also hosts the bootstrap server the decode
ranks register with.

The copy-out happens in the scheduler's tick, so the request's pages can be
released at once; what the sender thread does afterwards is rank-local and
never enters a collective.
"""

from __future__ import annotations

from engine.disaggregation.bootstrap import BootstrapServer
from engine.disaggregation.conn import KVSenderManager
from engine.managers.schedule_batch import Req
from engine.model_executor.model_runner import ModelRunner
from engine.server_args import ServerArgs


class PrefillBootstrap:
    def __init__(self, args: ServerArgs, tp_rank: int, tp_size: int, runner: ModelRunner):
        self.runner = runner
        host, port = args.disaggregation_bootstrap_host, args.disaggregation_bootstrap_port
        self.server = BootstrapServer(host, port, tp_size) if tp_rank == 0 else None
        self.sender = KVSenderManager(
            host, port, tp_rank, tp_size, args.model.num_heads, args.disaggregation_transfer_timeout
        )

    def send_kv(self, req: Req, first_token: int) -> None:
        """Copy the prompt's K/V (this rank's heads) out of L1 and queue the push."""
        n = len(req.input_ids)
        slots = self.runner.token_slots(req.req_pool_idx, n).to(self.runner.kv_pool.k_buffer.device)
        pool = self.runner.kv_pool
        k = pool.k_buffer[:, slots].cpu()
        v = pool.v_buffer[:, slots].cpu()
        self.sender.send(req.bootstrap_room, k, v, first_token)

    def close(self) -> None:
        self.sender.close()
        if self.server is not None:
            self.server.close()

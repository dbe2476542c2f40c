"""SGLang: srt/managers/scheduler.py (update_running_batch) and schedule_batch.py (retract_decode).

Decode and retract: the running batch, one more L1 page for each request whose
next token starts a page, and retraction (newest first) of the requests that
cannot get one, which go back to the front of the waiting queue.
"""

from __future__ import annotations

from engine.managers.schedule_batch import Req
from engine.managers.scheduler_resources import ReqResources
from engine.model_executor.model import ForwardItem
from engine.model_executor.model_runner import ModelRunner


class DecodeManager:
    def __init__(self, runner: ModelRunner, resources: ReqResources):
        self.runner, self.resources = runner, resources
        self.running: list[Req] = []

    def update_running_batch(self) -> list[Req]:
        """Mutates: pages of the running requests; returns the retracted ones, to be
        put back first in line, in the order SGLang's retract_decode leaves them."""
        retracted = []
        for req in list(reversed(self.running)):
            if not self.resources.grow_for_decode(req):
                self.running.remove(req)
                self.resources.release_retracted(req)
                retracted.insert(0, req)
        return retracted

    def decode_items(self) -> list[ForwardItem]:
        return [
            ForwardItem([r.output_ids[-1]], r.kv_len, self.runner.token_slots(r.req_pool_idx, r.kv_len + 1))
            for r in self.running
        ]

    def filter_finished(self) -> None:
        self.running = [r for r in self.running if not r.finished]

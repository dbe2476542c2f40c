"""TEST ONLY: break one invariant of the engine on purpose, so each chaos checker can be shown
to report (tests/chaos/test_broken_engine.py). Loaded in every rank through HCTOOL_PROBES
(this file's path); HCTOOL_TEST_BREAK names the invariant. It patches engine internals by
name on purpose: a rename makes this test probe fail loudly, it never blinds a tool.

- consensus: after 2 answers the last rank votes once more than its peers;
- liveness: after 4 answers, nothing is admitted again (every rank alike);
- correctness: answers that used the cache come back one token off;
- accounting: the first finished request leaves a lock on its prefix;
- metrics: /metrics counts one device-cached token too many per answer.
"""

import os

from hctool.agent.hooks import when_imported

BREAK = os.environ.get("HCTOOL_TEST_BREAK", "")
BREAKS = ("consensus", "liveness", "correctness", "accounting", "metrics")


def _patch(mod) -> None:
    import torch
    import torch.distributed as dist

    from engine.managers.io_struct import GenerateReqOutput

    cls = mod.Scheduler
    init, run_prefill, finish = cls.__init__, cls.run_prefill, cls.finish

    def patched_init(self, *a, **kw):
        init(self, *a, **kw)
        self._test_broken, self._test_off_by_one = False, set()
        if BREAK == "liveness":
            admit = self.prefill.get_new_batch_prefill
            self.prefill.get_new_batch_prefill = lambda *x, **y: None if self.counters.requests >= 4 else admit(*x, **y)
        if BREAK == "correctness":
            send = self.io.send

            def send_off_by_one(msg):
                if isinstance(msg, GenerateReqOutput) and msg.rid in self._test_off_by_one and msg.output_ids:
                    msg.output_ids[-1] = (msg.output_ids[-1] + 1) % self.args.model.vocab_size
                send(msg)
            self.io.send = send_off_by_one

    def patched_run_prefill(self, batch):
        if (BREAK == "consensus" and self.counters.requests >= 2 and not self._test_broken
                and self.tp_rank == self.sync.world_size - 1):
            self._test_broken = True
            dist.all_reduce(torch.zeros(2, dtype=torch.int64), op=dist.ReduceOp.MAX, group=self.sync.group)
        return run_prefill(self, batch)

    def patched_finish(self, req):
        if BREAK == "correctness" and req.cached and sum(req.cached.values()):
            self._test_off_by_one.add(req.rid)
        elif BREAK == "accounting" and self.counters.requests == 0:
            self.tree_cache.inc_lock_ref(req.last_node)
        elif BREAK == "metrics":
            self.counters.cached_tokens["device"] += 1
        return finish(self, req)

    cls.__init__, cls.run_prefill, cls.finish = patched_init, patched_run_prefill, patched_finish


if BREAK not in BREAKS:
    raise SystemExit(f"HCTOOL_TEST_BREAK must be one of {', '.join(BREAKS)}, got {BREAK!r}")
when_imported("engine.managers.scheduler", _patch)

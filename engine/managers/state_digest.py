"""SGLang: none (the per-tick placement digest of a context-parallel HiCache fork).

--state-digest: ranks can keep issuing identical collectives while their
replicated state drifts apart (a wall-clock LRU picks different victims), and
the first sign is wrong KV much later. So every tick each rank digests the state
that must be identical everywhere and folds the digest d into HiCache's per-tick
MIN all_reduce as [d, -d]: all ranks hold the same d iff min(d) == -min(-d), and
no collective is added. On a mismatch every rank writes its state record to
RUN_DIR/state/rank<R>.json and raises in the same tick; hctool compares the
records and names the first field that differs (hctool/repro/state.py).

What is NOT in the digest, because it is rank-local by design in a TP engine:
device/host page numbers (the free list's order follows each rank's copy timing;
each rank reads only its own pools), free counts *now*, events, IO progress.
"""

from __future__ import annotations

import hashlib
import json
import os

from engine.lab.snapshot import Replicated

# The order hctool compares fields in: queues, then the LRU order (a cause), then
# the tree and the allocators (its effects).
FIELDS = (
    "waiting_queue",
    "running",
    "ongoing_prefetch",
    "ack_queues",
    "lru_order",
    "radix_tree",
    "device_free",
    "host_free",
)


def state_record(rep: Replicated) -> dict[str, list]:
    """The replicated part of a tick's snapshot (engine/lab/snapshot.py), as JSON-able lists."""
    return {
        "waiting_queue": list(rep.waiting),
        "running": list(rep.running),
        "ongoing_prefetch": list(rep.ongoing_prefetch),
        "ack_queues": list(rep.ack_queues),
        "lru_order": [n.name for n in sorted(rep.nodes, key=lambda n: (n.last_access, n.id))],
        "radix_tree": [
            f"{'  ' * n.depth}{n.name} tokens={n.tokens} device={int(n.device_pages is not None)} "
            f"host={int(n.host_pages is not None)} backuped={int(n.backuped)} writing={int(n.writing)} "
            f"lock={n.lock_ref} host_ref={n.host_ref}"
            for n in rep.nodes
        ],
        "device_free": [rep.device_free_logical],
        "host_free": [rep.host_free_logical],
    }


class StateDigest:
    def __init__(self, run_dir: str, rank: int):
        self.path = os.path.join(run_dir or ".", "state", f"rank{rank}.json")
        self.rank = rank
        self.record: dict | None = None

    def digest(self, rep: Replicated) -> int:
        """This tick's record (the snapshot's replicated part) and its digest (< 2**56, so -d fits int64)."""
        self.record = state_record(rep)
        text = json.dumps([self.record[f] for f in FIELDS], separators=(",", ":"))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")

    def dump(self, tick: int) -> str:
        """Write the record the mismatched digest was computed from."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            json.dump({"rank": self.rank, "tick": tick, "fields": list(FIELDS), "state": self.record}, f, indent=0)
        return self.path

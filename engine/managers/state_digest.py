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

# The order hctool compares fields in: queues, then the LRU order (a cause), then
# the tree and the allocators (its effects).
FIELDS = ("waiting_queue", "running", "ongoing_prefetch", "ack_queues", "lru_order", "radix_tree",
          "device_free", "host_free")


def _node_name(node) -> str:
    # The chain hash of a node's last page names its whole prefix on every rank.
    return node.hash_value[-1][:12] if node.hash_value else "root"


def state_record(waiting, running, tree) -> dict[str, list]:
    """The replicated state of one rank, as JSON-able lists."""
    nodes = []
    stack = [(tree.root, 0)]
    while stack:  # canonical order: children sorted by their first page
        node, depth = stack.pop()
        if node is not tree.root:
            nodes.append((node, depth))
        stack.extend((c, depth + 1) for _, c in sorted(node.children.items(), reverse=True))
    c = tree.cache_controller
    acks = [len(c.ack_write_queue), len(c.ack_load_queue),
            len(tree.storage_io.ack_backup_queue) if tree.storage_io else 0]
    return {
        "waiting_queue": [r.rid for r in waiting],
        "running": [r.rid for r in running],
        "ongoing_prefetch": list(tree.ongoing_prefetch),
        "ack_queues": acks,
        "lru_order": [_node_name(n) for n, _ in sorted(nodes, key=lambda x: (x[0].last_access, x[0].id))],
        "radix_tree": [f"{'  ' * d}{_node_name(n)} tokens={len(n.key)} device={int(not n.evicted)} "
                       f"host={int(n.host_value is not None)} backuped={int(n.backuped)} writing={int(n.writing)} "
                       f"lock={n.lock_ref} host_ref={n.host_ref}" for n, d in nodes],
        "device_free": [tree.allocator.logical_available_size()],
        "host_free": [tree.host_allocator.logical_available_size()],
    }


class StateDigest:
    def __init__(self, run_dir: str, rank: int):
        self.path = os.path.join(run_dir or ".", "state", f"rank{rank}.json")
        self.rank = rank
        self.record: dict | None = None

    def digest(self, waiting, running, tree) -> int:
        """Builds this tick's record and returns its digest (< 2**56, so -d fits int64)."""
        self.record = state_record(waiting, running, tree)
        text = json.dumps([self.record[f] for f in FIELDS], separators=(",", ":"))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")

    def dump(self, tick: int) -> str:
        """Write the record the mismatched digest was computed from."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "w") as f:
            json.dump({"rank": self.rank, "tick": tick, "fields": list(FIELDS), "state": self.record}, f, indent=0)
        return self.path

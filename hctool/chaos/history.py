"""The JSONL history of an exploration (Jepsen style): every schedule invoked,
every fault switched on and off, every anomaly with its evidence, every verdict.
One JSON object per line, flushed as written, so a killed run keeps its past."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path


class History:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self._fh = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()

    def add(self, event: str, **fields) -> None:
        line = json.dumps({"t": round(time.monotonic() - self.t0, 3), "event": event, **fields}, default=str)
        with self._lock:
            self._fh.write(line + "\n")

    def close(self) -> None:
        self._fh.close()


def read_history(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

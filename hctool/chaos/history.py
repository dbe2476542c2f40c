"""The JSONL history of an exploration (Jepsen style): every schedule invoked,
every fault switched on and off, every anomaly with its evidence, every verdict.
One JSON object per line, flushed as written, so a killed run keeps its past.

A path inside the run folder is written relative to it (`s1-2/rank1.log`): the history is read
beside its runs, on another machine or after the folder moved, where the absolute path of the
machine that ran it names nothing."""

from __future__ import annotations

import json
import os
import re
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
        self._in_folder = _folder_prefix(self.path.parent)

    def add(self, event: str, **fields) -> None:
        line = json.dumps({"t": round(time.monotonic() - self.t0, 3), "event": event, **fields}, default=str)
        line = self._in_folder.sub("", line)
        with self._lock:
            self._fh.write(line + "\n")

    def close(self) -> None:
        self._fh.close()


def _folder_prefix(folder: Path) -> re.Pattern:
    """The run folder followed by a slash, as the runners write it (absolute, or relative to where
    hctool ran) and as JSON encodes it, where it starts a path (not inside a longer name)."""
    forms = {os.path.abspath(folder), os.path.realpath(folder), os.path.normpath(folder)}
    encoded = {json.dumps(f.rstrip("/") + "/")[1:-1] for f in forms if f not in ("", ".")}
    encoded = sorted(encoded, key=len, reverse=True)  # the longest form first: it is the whole prefix
    return re.compile(r"(?<![\w.\-/])(?:" + "|".join(map(re.escape, encoded)) + ")")


def read_history(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

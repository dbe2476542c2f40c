"""The run record: what a supervisor knew when it ended a job, written beside the traces
(hctool-run.json), so `check-consensus analyze` later gives the same verdict as the run."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hctool.protocol.safefile import read_regular, write_atomic

NAME = "hctool-run.json"
MAX_BYTES = 1 << 20
STACK_BYTES = 16 << 10  # of one rank's stacks kept in the record
MAX_STACK_RANKS = 48  # ranks whose stacks the record keeps (within MAX_BYTES)
LOCK_NAME = "hctool.lock"  # the claim of a run on its folder (hctool/supervise/runlock.py writes it)
MAX_LOCK_BYTES = 4096


def claimed_run(folder) -> str | None:
    """The run id the folder's lock names (None: no lock, or not one of ours). Read by the
    supervisor and by a rank whose environment lost HCTOOL_RUN_ID (a program that edited it)."""
    try:
        data = json.loads(read_regular(Path(folder) / LOCK_NAME, MAX_LOCK_BYTES) or b"{}")
    except (OSError, ValueError):
        return None
    run = data.get("run") if isinstance(data, dict) else None
    return run if isinstance(run, str) and run else None


class RunRecordError(ValueError):
    """A file at that name that is not a run record (the folder may come from anyone)."""


@dataclass
class RunRecord:
    command: list[str]
    exit_codes: dict[int, int | None]  # rank -> exit code (None: killed by hctool at the end)
    command_exit_code: int | None = None  # a wrapper command's own code (torchrun), if it ended by itself
    faults: list[dict] = field(default_factory=list)  # per fault: spec and how often it fired per rank
    ended_at: float | None = None  # monotonic time hctool began ending ranks still running
    stacks: dict[str, str] = field(default_factory=dict)  # rank -> its stacks when hctool ended the job

    def __post_init__(self) -> None:
        # bounded: a record is read back whole (MAX_BYTES); a rank's text keeps its head
        self.stacks = {str(r): t[:STACK_BYTES] for r, t in list(self.stacks.items())[:MAX_STACK_RANKS]}

    def write(self, folder: Path) -> Path:
        path = Path(folder) / NAME
        data = json.dumps({**asdict(self), "exit_codes": {str(r): c for r, c in self.exit_codes.items()}})
        write_atomic(path, data.encode())  # a link planted at the name is replaced, never written through
        return path

    @classmethod
    def read(cls, folder: Path) -> RunRecord | None:
        """The folder's record (None: there is none); RunRecordError for anything else there."""
        path = Path(folder) / NAME
        if not os.path.lexists(path):
            return None
        try:
            raw = read_regular(path, MAX_BYTES)
        except OSError:
            raise RunRecordError(f"{path}: not a small regular file") from None
        try:
            data = json.loads(raw)
            codes = {int(r): c for r, c in (data.get("exit_codes") or {}).items()}
            command_exit = data.get("command_exit_code")
            ok = all(0 <= r < 1 << 16 and (c is None or isinstance(c, int)) for r, c in codes.items())
            if not ok or len(codes) > 1 << 16 or not (command_exit is None or isinstance(command_exit, int)):
                raise ValueError("bad exit codes")
            faults = data.get("faults") or []
            if not isinstance(faults, list) or not all(isinstance(f, dict) for f in faults):
                raise ValueError("bad fault list")
            command = [str(c) for c in data.get("command") or []]
            ended_at = data.get("ended_at")
            if not (ended_at is None or isinstance(ended_at, (int, float))):
                raise ValueError("bad ended_at")
            stacks = data.get("stacks") or {}
            if not isinstance(stacks, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in stacks.items()
            ):
                raise ValueError("bad stacks")
        except (ValueError, TypeError, AttributeError) as exc:
            raise RunRecordError(f"{path}: not a run record ({exc})") from None
        return cls(command, codes, command_exit, faults, ended_at, stacks)

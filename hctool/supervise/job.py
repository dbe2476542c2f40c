"""A command job: the user's program (`-- torchrun ... train.py`, or `-- SCRIPT.py` whose ranks
hctool starts itself, as torchrun would), as the supervisor's watch loop sees it (supervise/watch.py
`Job`). The ranks' pids and exit codes are hctool's own children's for a script; under a wrapper
command the traces' headers name the ranks' pids and their end records say how they ended."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hctool.protocol.safefile import open_append
from hctool.supervise import procs
from hctool.supervise.procs import alive
from hctool.supervise.stacks import dump_stacks, ranks_in_tree


@dataclass
class RankFailure:
    rank: int
    returncode: int

    def message(self) -> str:
        return f"rank {self.rank} failed ({procs.describe_exit(self.returncode)})"


class OutputEcho:
    """The program's own output, shown as torchrun shows it (on hctool's stderr: its stdout is
    the report's): each pass of the watch loop prints the complete lines each log gained, a
    script's ranks prefixed `[rankN]` as torchrun's --tee does; the logs keep everything."""

    def __init__(self, folder: Path, script_mode: bool, show: Callable[[str], None]):
        self.folder, self.script_mode, self.show = folder, script_mode, show
        self.offsets: dict[Path, int] = {}

    def __call__(self, final: bool = False) -> None:
        for path in sorted(self.folder.glob("rank*.log" if self.script_mode else "cmd.log")):
            start = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read(MAX_ECHO_BYTES)
            except OSError:
                continue
            end = len(data) if final else data.rfind(b"\n") + 1  # whole lines only, until the end
            if end <= 0:
                continue
            self.offsets[path] = start + end
            prefix = f"[{path.stem}] " if self.script_mode else ""
            for line in data[:end].decode(errors="replace").splitlines():
                self.show(prefix + line)


MAX_ECHO_BYTES = 1 << 20  # per log per pass: a program printing faster than this is read on over passes


class CommandJob:
    def __init__(self, ps: procs.ProcessSet, ranks: dict[int, procs.Child], watcher, script_mode: bool):
        self.ps, self.ranks, self.watcher, self.script_mode = ps, ranks, watcher, script_mode

    def pids_by_rank(self) -> dict[int, int]:
        if self.script_mode:
            return {r: c.popen.pid for r, c in self.ranks.items() if c.popen.poll() is None}
        return {r: p for r, p in self.watcher.pids().items() if alive(p)}

    def rank_exit_codes(self) -> dict[int, int | None]:
        """Per rank: exit code, or None while alive. Under a wrapper command the ranks' own codes
        are unknown: an end record means 0 (or 1 after an uncaught exception), a vanished process
        without one means it was killed (-9)."""
        if self.script_mode:
            return {r: c.popen.poll() for r, c in self.ranks.items()}
        out: dict[int, int | None] = {}
        for r, rt in self.watcher.reader.ranks.items():
            out[r] = None if alive(rt.pid) else {"clean": 0, "crashed": 1}.get(rt.ended, -9)
        return out

    def first_death(self) -> RankFailure | None:
        """A rank hctool started that failed (a wrapper command's ranks are its launcher's to end)."""
        if not self.script_mode:
            return None
        failed = [(r, c) for r, c in self.rank_exit_codes().items() if c not in (None, 0)]
        return RankFailure(*failed[0]) if failed else None

    def alive(self) -> bool:
        return bool(self.ps.alive())

    def command_exit(self) -> int | None:
        """A wrapper command's own exit code, if it ended (None for a script's ranks)."""
        return None if self.script_mode or not self.ps.children else self.ps.children[0].popen.poll()

    def stacks(self, trace_dir: str) -> dict[str, str]:
        pids: dict[int, int | list[int]] = {}
        if self.script_mode:
            pids = {r: c.popen.pid for r, c in self.ranks.items() if c.popen.poll() is None}
        else:
            for child in self.ps.alive():
                pids.update(ranks_in_tree(child.popen.pid))
            pids.update(self.pids_by_rank())
        return dump_stacks(pids, timeout=5.0, trace_dir=trace_dir) if pids else {}

    def stop(self) -> None:
        """End the job (every process of its tree reaped). A wrapper command still running is ended
        by hctool: its log says so first, for whoever reads it, since a launcher answers the SIGTERM
        with a traceback of its own (torchrun's SignalException) that is not the program's doing."""
        running = [c for c in self.ps.alive() if c.log_path is not None]
        if not self.script_mode and running:
            with contextlib.suppress(OSError):
                fd = open_append(running[0].log_path)
                try:
                    os.write(fd, TEARDOWN_NOTE)
                finally:
                    os.close(fd)
        self.ps.terminate_all()


TEARDOWN_NOTE = (
    b"[hctool] hctool ends the job here (SIGTERM to the command and its workers): what the launcher "
    b"prints from here on (torchrun: a SignalException traceback) answers that, not the program\n"
)

"""LiveWatcher: the supervisor's view of a running job, from the trace files.

The supervisor calls check() in its own loop (every ~0.2 s). Each call reads
only the bytes appended since the previous one, folds them into the per-group
channels, drops the prefix every member agreed on and completed (memory stays
bounded on long runs), and looks for a divergence or a call blocked longer
than hang_after while a peer is elsewhere. The ranks' process groups are
never used for this.
"""

from __future__ import annotations

import time

from hctool.consensus.analyze import AnalysisSession
from hctool.consensus.model import Kind, Report, Verdict
from hctool.supervise.procs import alive as _alive


class LiveWatcher:
    def __init__(self, trace_dir, world_size: int | None, hang_after: float = 5.0, settle: float = 0.5):
        self.session = AnalysisSession(trace_dir, world_size)
        self.reader, self.tracker = self.session.reader, self.session.tracker
        self.hang_after = hang_after
        self.settle = settle
        self.events_seen = 0
        self.detection: dict | None = None  # wall times of the divergent call and of its detection
        self.finding: Report | None = None  # the first finding of any check (what a Ctrl-C summary names)

    def check(self, exit_codes: dict[int, int | None] | None = None) -> Report | None:
        """A report (verdict diverged, hung or crashed) once the ranks disagree or
        a call waits past hang_after for a peer that is elsewhere; else None.
        exit_codes: what the supervisor knows of its rank processes (None: alive)."""
        now = time.monotonic()
        self.events_seen += self.session.feed(now)
        ended = self.session.ended(exit_codes)
        for r, state in ended.items():  # a rank gone without an end record was killed or aborted
            rt = self.reader.ranks.get(r)
            if state is None and rt is not None and (exit_codes is None or r not in exit_codes) and not _alive(rt.pid):
                ended[r] = "crashed"
        report, finding = self.session.report(ended, now, self.hang_after, final=False)
        if finding is None:
            return None
        self.detection = {
            "divergent_call_wall": finding.get("evidence_time", finding["time"]),
            "detected_wall": time.time(),
        }
        if self.finding is None:
            self.finding = report
        return report

    def latency_s(self) -> float | None:
        """Seconds from the first divergent call to its detection."""
        if not self.detection:
            return None
        return max(0.0, self.detection["detected_wall"] - self.detection["divergent_call_wall"])

    def pending(self) -> int:
        """Events held in memory (the part not yet agreed by every member)."""
        return self.tracker.pending()

    def pids(self) -> dict[int, int]:
        return {r: rt.pid for r, rt in self.reader.ranks.items()}


def merge_live(final: Report, live: Report | None, stacks: dict[str, str]) -> Report:
    """The report of a run: the final analysis of every trace, except what ending the job took
    away from it. A finding seen live stands if the final data lost it (a consistent or an
    unseen verdict), and a wait cycle seen live stays on the finding it explains (ending the
    job broke the cycle the final data would show)."""
    if live is None:
        return final
    if (final.verdict is Verdict.CONSISTENT or not final.verdict.seen) and live.first_divergence is not None:
        live.stacks, live.exit_codes = stacks, final.exit_codes
        live.command_exit_code, live.coverage = final.command_exit_code, final.coverage
        return live
    lf, ff = live.first_divergence, final.first_divergence
    if lf is not None and lf.deadlock and (ff is None or not ff.deadlock):
        if lf.kind is Kind.WAIT_CYCLE:
            final.verdict, final.first_divergence = live.verdict, lf
        elif ff is not None and (lf.group, lf.seq) == (ff.group, ff.seq):
            ff.deadlock, ff.cycle = lf.deadlock, lf.cycle
    return final

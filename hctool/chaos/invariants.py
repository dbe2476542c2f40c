"""Invariant checkers: each reads what the processes did in one chaos run and
returns anomalies with their evidence. A checker that could not look (the run
ended before quiesce, say) returns None: it neither passes nor fails."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from hctool.consensus.model import Report, Verdict

CHECKERS = ("consensus", "liveness", "correctness", "accounting", "metrics")
STATUS_LINE = re.compile(r"\[rank (\d+)\] tick (\d+): waiting (\d+) running (\d+) prefetching (\d+) .*")
MISMATCH = ("collective mismatch", "diverged across ranks", "Received data size")


class Anomaly(NamedTuple):
    invariant: str
    evidence: dict


@dataclass
class RunRecord:
    """Everything one run left behind, gathered by the runner."""

    run_dir: Path
    outcome: str  # the harness's: done | stalled | deadline | watcher | death
    death: str | None
    watcher_report: Report | None
    final_report: Report | None
    sent: int
    answered: dict  # (tag, index) -> output ids
    meta: dict  # (tag, index) -> meta_info
    expected: dict  # (tag, index) -> reference output ids
    errors: list[str]
    unanswered: int
    killed_ranks: list[int] = field(default_factory=list)
    cancelled: int = 0
    metrics_text: str | None = None
    orphans: list[int] = field(default_factory=list)

    def logs(self) -> dict[str, str]:
        return {p.stem: p.read_text(errors="replace") for p in sorted(self.run_dir.glob("rank*.log"))}

    def probe_files(self, prefix: str) -> dict[int, dict]:
        out = {}
        for p in sorted((self.run_dir / "chaos").glob(f"{prefix}-rank*.json")):
            out[int(p.stem.rsplit("rank", 1)[1])] = json.loads(p.read_text())
        return out


def check_consensus(r: RunRecord) -> list[Anomaly] | None:
    # A stalled run's ranks are killed wherever they are, so a "hung" read from
    # their traces afterwards is that snapshot: liveness reports the stall.
    killed_busy = r.outcome in ("stalled", "deadline")
    for report in (r.watcher_report, r.final_report):
        if report and (
            report.verdict is Verdict.DIVERGED
            or (report.verdict is Verdict.HUNG and report.first_divergence and not killed_busy)
        ):
            first = report.first_divergence
            return [
                Anomaly(
                    "consensus",
                    {
                        "verdict": report.verdict.value,
                        "cause": first.cause_line() if first else report.reason,
                        "symptom": first.symptom_line() if first else None,
                        "first_divergence": first.to_json() if first else None,
                        "counts": report.counts,
                    },
                )
            ]
    if r.death and not r.killed_ranks:
        for name, text in r.logs().items():
            hit = next((line for line in text.splitlines() if any(m in line for m in MISMATCH)), None)
            if hit:
                return [Anomaly("consensus", {"death": r.death, "log": name, "line": hit.strip()[:300]})]
    return []


def last_status(r: RunRecord) -> dict[str, str]:
    out = {}
    for name, text in r.logs().items():
        lines = [ln for ln in text.splitlines() if STATUS_LINE.match(ln)]
        if lines:
            out[name] = lines[-1]
    return out


def check_liveness(r: RunRecord) -> list[Anomaly] | None:
    found = []
    starved = r.probe_files("starved")
    if starved:
        found.append(Anomaly("liveness", {"what": "work waiting and nothing running", "ranks": starved}))
    if r.outcome in ("stalled", "deadline"):
        found.append(
            Anomaly(
                "liveness",
                {
                    "what": f"workload {r.outcome}: {r.unanswered} of {r.sent} requests unanswered, ranks alive",
                    "status": last_status(r),
                },
            )
        )
    elif r.death and not r.killed_ranks and not check_consensus(r):
        found.append(Anomaly("liveness", {"what": "a rank died", "death": r.death, "status": last_status(r)}))
    elif r.outcome == "done" and r.unanswered:
        found.append(Anomaly("liveness", {"what": f"{r.unanswered} requests never answered", "errors": r.errors[:3]}))
    lost = [e for e in r.errors if any(w in e for w in ("Timeout", "ConnectionError", "RemoteDisconnected"))]
    if lost:  # an HTTP error with a reason is an answer; a dropped connection is not
        found.append(Anomaly("liveness", {"what": f"{len(lost)} requests lost without an answer", "errors": lost[:3]}))
    return found


def check_correctness(r: RunRecord) -> list[Anomaly] | None:
    for key, got in sorted(r.answered.items()):
        want = r.expected.get(key)
        if want is not None and got != want:
            at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            return [
                Anomaly(
                    "correctness",
                    {
                        "request": f"{key[0]}:{key[1]}",
                        "first_diff_at": at,
                        "expected": want[at : at + 8],
                        "got": got[at : at + 8],
                        "mismatched": sum(r.expected.get(k) not in (None, v) for k, v in r.answered.items()),
                    },
                )
            ]
    return []


def check_accounting(r: RunRecord) -> list[Anomaly] | None:
    if r.outcome != "done":
        return None
    found = []
    if r.orphans:
        found.append(Anomaly("accounting", {"what": "processes left after teardown", "pids": r.orphans}))
    if r.probe_files("observer-error"):
        return None  # the in-rank observer failed: accounting could not look (it says why in chaos/)
    records = r.probe_files("quiesce")
    for rank, q in sorted(records.items()):
        problems = []
        l1 = q["l1"]
        if l1["free"] + l1["cached"] + l1["in_use"] != l1["total"] or l1["in_use"]:
            problems.append(
                f"L1 free {l1['free']} + cached {l1['cached']} + in use {l1['in_use']} "
                f"vs total {l1['total']} at quiesce"
            )
        l2 = q.get("l2")
        if l2 and l2["free"] + l2["used"] != l2["total"]:
            problems.append(f"L2 free {l2['free']} + used {l2['used']} != total {l2['total']}")
        if q["locked_nodes"]:
            problems.append(f"{len(q['locked_nodes'])} tree nodes still locked")
        if q["host_ref_nodes"] and not q["in_flight"]:
            problems.append(f"{len(q['host_ref_nodes'])} nodes keep host references with nothing in flight")
        if q["req_slots"]["free"] != q["req_slots"]["total"]:
            problems.append(f"request slots free {q['req_slots']['free']} of {q['req_slots']['total']}")
        if problems:
            found.append(Anomaly("accounting", {"rank": rank, "problems": problems, "record": q}))
    return found if records or found else None


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def check_metrics(r: RunRecord) -> list[Anomaly] | None:
    if r.outcome != "done" or r.metrics_text is None:
        return None
    m = parse_metrics(r.metrics_text)
    client = {"device": 0, "host": 0, "storage": 0}
    bad_split = []
    for key, meta in r.meta.items():
        details = meta.get("cached_tokens_details") or {}
        for k in client:
            client[k] += details.get(k, 0)
        if sum(details.values()) != meta.get("cached_tokens", 0):
            bad_split.append(f"{key[0]}:{key[1]}")
    found = []
    if bad_split:
        found.append(
            Anomaly("metrics", {"what": "cached_tokens != sum of cached_tokens_details", "requests": bad_split[:5]})
        )
    for src, value in client.items():
        served = m.get(f'hicache_cached_tokens_total{{cache_source="{src}"}}')
        # Cancelled requests still run (and count) on the engine; nobody saw their meta_info.
        if served is None or (served != value if not r.cancelled else served < value):
            found.append(
                Anomaly(
                    "metrics",
                    {"what": f"/metrics cached tokens from {src} vs responses", "metrics": served, "responses": value},
                )
            )
    return found


def check_all(r: RunRecord, only: tuple[str, ...] = CHECKERS) -> tuple[list[Anomaly], list[str]]:
    """(anomalies, checkers that could not look)."""
    anomalies, blind = [], []
    for name in only:
        res = globals()[f"check_{name}"](r)
        if res is None:
            blind.append(name)
        else:
            anomalies.extend(res)
    return anomalies, blind

"""Rule metadata: codes, kebab-case names and the help text shown in docs and SARIF."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    summary: str
    help: str


RULES: dict[str, Rule] = {
    r.code: r
    for r in (
        Rule(
            "HC100",
            "unused-suppression",
            "A `# hctool: ignore[...]` or `# noqa: HCnnn` comment that suppresses nothing.",
            "Remove the comment, or fix the code list: a stale suppression would hide a future finding.",
        ),
        Rule(
            "HC101",
            "collective-in-rank-local-loop",
            "A collective inside a loop whose trip count or exits depend on rank-local state.",
            "Every rank must run the loop the same number of times. Decide exits from replicated state "
            "(the broadcast request list, results of earlier collectives), or hoist the collective out of "
            "the loop and issue it once per tick.",
        ),
        Rule(
            "HC102",
            "collective-under-rank-local-branch",
            "A collective reached only under a condition on rank-local state.",
            "Make the condition uniform (reduce it across ranks first), or issue the same collective "
            "sequence in every arm.",
        ),
        Rule(
            "HC103",
            "rank-local-early-exit",
            "A return/raise on rank-local state that skips a later collective.",
            "Ranks that exit early skip the collective their peers enter, which hangs or mismatches. "
            "Agree on the exit first (all_reduce the flag), then exit on every rank.",
        ),
        Rule(
            "HC104",
            "wall-clock-replicated-decision",
            "A wall-clock or per-rank timing value orders or selects replicated state.",
            "Clocks differ between ranks, so eviction order or deadlines computed from them diverge. "
            "Use a replicated logical clock (a tick counter) or reduce the decision across ranks.",
        ),
    )
}

ALL_CODES = tuple(sorted(RULES))

"""A multi-rank test's failure as pytest shows it, in the detail `--tb` asks for.

The controller composes one `Failure` (three renderings of the same finding) and raises
`RanksFailed`; the plugin's makereport hook puts a `FailureRepr` on the report. pytest then
prints `long` (`--tb=auto|long|native`), `short` (`--tb=short`) or only the one `headline`
line (`--tb=line`, and the short test summary under any style), and its JUnit XML writes the
headline as the `<failure message>` and `long` as the text, whatever `--tb` was. A plain
`pytest.fail(text)` could not do this: pytest prints its whole text under every style."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from _pytest._code.code import ReprFileLocation, TerminalRepr

# the key under which an xdist worker's report carries the failure to the controller
SERIAL_KEY = "hctool_failure"


class Failure(NamedTuple):
    headline: str  # one line: what went wrong and its cause (JUnit message, --tb=line, the summary)
    short: str  # the headline's lines, the symptom and one frame per rank
    long: str  # that, then the first failure's traceback, each rank's stack and log tail
    path: str  # where an editor should jump: the cause's line in the test file, else the test
    line: int


class RanksFailed(pytest.fail.Exception):  # type: ignore[name-defined,misc]
    """pytest.fail's exception, carrying the whole finding."""

    def __init__(self, failure: Failure):
        super().__init__(failure.headline, pytrace=False)
        self.failure = failure


class FailureRepr(TerminalRepr):
    """The report's longrepr: pytest's terminal calls toterminal, its JUnit writer str()."""

    def __init__(self, failure: Failure, style: str):
        self.failure = failure
        self.style = style
        self.reprcrash = ReprFileLocation(failure.path, failure.line, failure.headline)

    def toterminal(self, tw) -> None:
        if self.style in ("line", "no"):  # pytest writes the reprcrash line itself
            return
        text = self.failure.short if self.style == "short" else self.failure.long
        first, *rest = text.splitlines() or [""]
        tw.line(first, red=True, bold=True)
        for line in rest:
            tw.line(line)

    def __str__(self) -> str:
        return self.failure.long

    def to_json(self) -> dict:
        return {"failure": self.failure._asdict(), "style": self.style}

    @classmethod
    def from_json(cls, data: dict) -> FailureRepr:
        return cls(Failure(**data["failure"]), data["style"])

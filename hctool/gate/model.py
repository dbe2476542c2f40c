"""The summary of `hctool gate --json`, typed as commands/gate.py builds it (a plain dict of the
steps' StepResult and Case tuples, gate/steps.py). Nothing builds these types; `hctool schema
gate` publishes the JSON Schema made from them (docs/schemas/). Closed objects.
"""

from __future__ import annotations

from typing import Literal

# typing_extensions' TypedDict, not typing's: pydantic refuses typing's on Python 3.11
from typing_extensions import TypedDict

# gate/steps.py PASSED, FAILED, ERROR, SKIPPED; tests/test_json_schemas.py holds this to them
Status = Literal["passed", "failed", "error", "skipped"]
StepName = Literal["lint", "tests", "repro", "chaos"]


class CaseJSON(TypedDict):
    """One case: a lint finding, a test, a repro variant or a chaos schedule (as in --junit)."""

    name: str
    classname: str
    status: Status
    message: str
    text: str
    seconds: float
    file: str | None
    line: int | None


class StepJSON(TypedDict):
    name: StepName
    status: Status
    seconds: float
    summary: str
    cases: list[CaseJSON]


class GateSummary(TypedDict):
    """`hctool gate --json`: the exit code (0 clean, 1 findings, 2 a step could not run) and each step."""

    exit_code: Literal[0, 1, 2]
    artifacts: str
    steps: list[StepJSON]

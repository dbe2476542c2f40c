"""`hctool lint --format json` (or `--json`), typed as output.py's to_json builds it (plain
dicts). Nothing builds these types; `hctool schema lint` publishes the JSON Schema made from them
(docs/schemas/). Closed objects.
"""

from __future__ import annotations

from typing import Literal

# typing_extensions' TypedDict, not typing's: pydantic refuses typing's on Python 3.11
from typing_extensions import TypedDict

# rules.py RULES and sources.py LEVELS; tests/test_json_schemas.py holds these to them
RuleCode = Literal["HC100", "HC101", "HC102", "HC103", "HC104"]
Severity = Literal["high", "medium", "low"]
Role = Literal["source", "collective", "condition", "loop", "exit", "chain"]


class RelatedJSON(TypedDict):
    """Another line of the finding: a gated collective, a deciding condition, a loop, an early
    exit, another line of the same source, or a step of the call chain."""

    path: str
    line: int
    message: str
    role: Role


class FindingJSON(TypedDict):
    """One root cause: a rank-local source and every collective it gates (docs/lint.md)."""

    rule: RuleCode
    name: str
    path: str  # relative to the working directory
    line: int
    col: int
    severity: Severity
    premise: str | None  # severity medium: the premise it is true under
    count: int  # gated collective calls
    message: str
    related: list[RelatedJSON]


# the whole document: findings sorted by path, line, column and rule
LintJSON = list[FindingJSON]

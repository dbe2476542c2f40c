"""What the typed models of hctool's `--json` documents share (the models live next to their
producers: consensus/report_json.py, chaos/model.py, repro/model.py, gate/model.py, lint/model.py;
hctool/commands/schema.py turns them into the JSON Schemas of docs/schemas/).

Stdlib only, as all of hctool/protocol: the marker below is read by pydantic through its hook
method, without this module importing pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any


class KeyPattern:
    """A constraint on a string in the published schema (`pattern`); as the key type of a dict
    it becomes that object's `patternProperties`, and the schema generator closes the object to it."""

    def __init__(self, pattern: str, description: str) -> None:
        self.pattern, self.description = pattern, description

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Callable[[Any], dict]) -> dict:
        return {**handler(core_schema), "pattern": self.pattern, "description": self.description}


# A JSON object key that is a rank number: "0", "1", ... (JSON keys are strings)
RankKey = Annotated[str, KeyPattern("^[0-9]+$", "a rank")]

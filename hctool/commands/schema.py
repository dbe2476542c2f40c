"""`hctool schema [NAME]`: the JSON Schema of each command's `--json` document, made from the
typed models (TypedDicts next to each producer) with pydantic; docs/schemas/ holds them as
published (`hctool schema --write docs/schemas` regenerates them; tests/test_json_schemas.py
fails when they are stale, and checks every command's output against them).

The registry sits here, with the commands, because the models span every layer (gate's included,
which hctool/report may not import).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from hctool.console.errors import UsageError

# name -> (the model, as module:attribute; the command lines whose --json it describes)
SCHEMAS: dict[str, tuple[str, str]] = {
    "check-consensus": ("hctool.consensus.report_json:ReportJSON", "hctool check-consensus run|analyze --json"),
    "repro-list": ("hctool.repro.model:ListEntry", "hctool repro list --json"),
    "repro": ("hctool.repro.model:IncidentResult", "hctool repro ID --json"),
    "repro-all": ("hctool.repro.model:AllResult", "hctool repro all --json"),
    "lint": ("hctool.lint.model:FindingJSON", "hctool lint --json (--format json)"),
    "chaos": ("hctool.chaos.model:ChaosReport", "hctool chaos run|explore|shrink|merge --json"),
    "gate": ("hctool.gate.model:GateSummary", "hctool gate --json"),
}
# documents that are a list of the model's objects
LISTS = {"repro-list", "lint"}
# other shapes the same commands print: chaos's finding that the program fails with no fault at all
ALTERNATIVES = {"chaos": "hctool.chaos.model:ChaosBaselineFailure"}

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _model(ref: str) -> Any:
    import importlib

    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _closed(node: Any) -> None:
    """Every object the models name is closed: a key they do not name fails validation (an
    open object is typed as a plain dict[str, Any], with no properties). Property titles,
    pydantic's restatement of the key's name, are left out."""
    if isinstance(node, dict):
        if "properties" in node or "patternProperties" in node:
            node.setdefault("additionalProperties", False)
        for prop in node.get("properties", {}).values():
            prop.pop("title", None)
        for value in node.values():
            _closed(value)
    elif isinstance(node, list):
        for value in node:
            _closed(value)


def json_schema(name: str) -> dict:
    """The JSON Schema (draft 2020-12) of one --json document."""
    from pydantic import TypeAdapter

    ref, command = SCHEMAS[name]
    model = _model(ref)
    shape: Any = list[model] if name in LISTS else model  # type: ignore[valid-type]
    if name in ALTERNATIVES:
        shape = model | _model(ALTERNATIVES[name])
    generated = TypeAdapter(shape).json_schema()
    _closed(generated)
    generated.pop("title", None)  # the model's class name: the document's title is its schema's name
    description = generated.pop("description", f"`{command}`.")
    return {"$schema": DRAFT, "title": name, "description": f"{description} docs/contracts.md.", **generated}


def schema_text(name: str) -> str:
    """As published in docs/schemas/<name>.schema.json."""
    return json.dumps(json_schema(name), indent=2) + "\n"


def register(app: typer.Typer) -> None:
    @app.command("schema")
    def schema_command(
        name: str | None = typer.Argument(None, help="Which document (no name: list them)."),
        write: Path | None = typer.Option(
            None, "--write", metavar="DIR", help="Write every schema as DIR/<name>.schema.json (docs/schemas/)."
        ),
    ) -> None:
        """Print the JSON Schema of a command's --json output, made from hctool's typed models."""
        if write is not None:
            if name is not None:
                raise UsageError("--write writes every schema: give no name", "hctool schema --write docs/schemas")
            try:
                write.mkdir(parents=True, exist_ok=True)
                for each in SCHEMAS:
                    (write / f"{each}.schema.json").write_text(schema_text(each))
            except OSError as exc:
                raise UsageError(f"cannot write into {write}: {exc.strerror}", "pick a writable folder") from None
            print("\n".join(str(write / f"{each}.schema.json") for each in SCHEMAS))
            return
        if name is None:
            width = max(map(len, SCHEMAS))
            print("\n".join(f"{each:<{width}}  {command}" for each, (_, command) in SCHEMAS.items()))
            return
        if name not in SCHEMAS:
            raise UsageError(f"no schema named {name!r}", f"known: {', '.join(SCHEMAS)}")
        print(schema_text(name), end="")

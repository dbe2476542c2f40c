"""README.md's sample output of `hctool repro 30760` is rendered here from a recorded run
(tests/fixtures/readme/repro-30760.json, the --json of a real run), by the same code that prints
it, and the call sites it names are still where the engine's code issues those collectives:
change the renderer or move those lines and this fails until the sample is made again with

    hctool repro 30760 --json > tests/fixtures/readme/repro-30760.json
    python -m tests.test_readme        # rewrites README.md's block from it
"""

from __future__ import annotations

import ast
import io
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "readme" / "repro-30760.json"
BEGIN, END = "<!-- sample: hctool repro 30760 (tests/test_readme.py) -->", "<!-- end of sample -->"
WIDTH = 180


def rendered() -> str:
    from rich.console import Console

    from hctool.commands.repro import variant_table

    result = json.loads(FIXTURE.read_text())
    console = Console(file=io.StringIO(), width=WIDTH, color_system=None, record=True)
    console.print(variant_table(result))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return block.strip().removeprefix("```").removesuffix("```").strip("\n")


def test_readme_sample_is_what_the_renderer_prints():
    assert readme_block() == rendered(), "run `python -m tests.test_readme` to make README.md's sample again"


def _defining_function(path: Path, line: int) -> str | None:
    tree = ast.parse(path.read_text())
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            if best is None or node.lineno > best.lineno:
                best = node
    return best.name if best else None


def test_the_sites_the_sample_names_are_still_those_collectives():
    result = json.loads(FIXTURE.read_text())
    sites = [(e["site"], e["function"], e["op"]) for v in result["variants"] if v["first_divergence"]
             for e in v["first_divergence"]["ranks"].values() if e.get("site")]
    assert sites, "the sample's bug variant must name its divergent calls"
    for site, function, op in sites:
        name, line = site.rsplit(":", 1)
        (path,) = [p for p in (REPO / "engine").rglob(name)]
        text = path.read_text().splitlines()[int(line) - 1]
        assert op.split("_")[0] in text or "dist." in text, (site, text)
        assert _defining_function(path, int(line)) == function, (site, function)


if __name__ == "__main__":
    text = (REPO / "README.md").read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    (REPO / "README.md").write_text(f"{head}{BEGIN}\n```\n{rendered()}\n```\n{END}{tail}")
    print(re.sub(r"\s+$", "", rendered()))

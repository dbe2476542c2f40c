"""README.md's sample outputs are rendered here from recorded runs, by the same code that
prints them, and the call sites they name are still where the code issues those collectives:
`hctool repro 30760` (tests/fixtures/readme/repro-30760.json, the --json of a real run) and
`hctool check-consensus run` on examples/extra_call.py (consensus-extra-call.json). Change the
renderer or move those lines and this fails until the samples are made again with

    hctool repro 30760 --json > tests/fixtures/readme/repro-30760.json
    hctool check-consensus run --nproc 2 --json -- examples/extra_call.py \
        > tests/fixtures/readme/consensus-extra-call.json
    python -m tests.test_readme        # rewrites README.md's blocks from them
"""

from __future__ import annotations

import ast
import io
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "readme" / "repro-30760.json"
CHECK_FIXTURE = REPO / "tests" / "fixtures" / "readme" / "consensus-extra-call.json"
BEGIN, END = "<!-- sample: hctool repro 30760 (tests/test_readme.py) -->", "<!-- end of sample -->"
CHECK_BEGIN = "<!-- sample: hctool check-consensus run -- examples/extra_call.py (tests/test_readme.py) -->"
WIDTH = 180
CHECK_WIDTH = 120


def rendered() -> str:
    from rich.console import Console

    from hctool.commands.repro import variant_table

    result = json.loads(FIXTURE.read_text())
    console = Console(file=io.StringIO(), width=WIDTH, color_system=None, record=True)
    console.print(variant_table(result))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def rendered_check() -> str:
    """The text `check-consensus run` prints, without the stacks (the README says they follow)."""
    from rich.console import Console

    from hctool.consensus.model import Report
    from hctool.consensus.report import render

    report = Report.from_json(json.loads(CHECK_FIXTURE.read_text()))
    report.stacks = {}
    console = Console(file=io.StringIO(), width=CHECK_WIDTH, color_system=None, record=True)
    render(report, console)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def readme_block(begin: str = BEGIN) -> str:
    text = (REPO / "README.md").read_text()
    block = text.split(begin, 1)[1].split(END, 1)[0]
    return block.strip().removeprefix("```").removesuffix("```").strip("\n")


def test_readme_sample_is_what_the_renderer_prints():
    assert readme_block() == rendered(), "run `python -m tests.test_readme` to make README.md's sample again"


def test_readme_check_sample_is_what_the_renderer_prints():
    assert readme_block(CHECK_BEGIN) == rendered_check(), "run `python -m tests.test_readme` to make it again"
    # and it names the example's extra call, on the rank that makes it
    first = json.loads(CHECK_FIXTURE.read_text())["first_divergence"]
    lines = (REPO / "examples" / "extra_call.py").read_text().splitlines()
    line = int(first["cause"]["site"].rsplit(":", 1)[1])
    assert "dist.all_reduce" in lines[line - 1] and "the extra call" in lines[line - 1], lines[line - 1]
    assert first["culprit_ranks"] == [1] and first["kind"] == "extra"


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
    sites = [
        (e["site"], e["function"], e["op"])
        for v in result["variants"]
        if v["first_divergence"]
        for e in v["first_divergence"]["ranks"].values()
        if e.get("site")
    ]
    assert sites, "the sample's bug variant must name its divergent calls"
    for site, function, op in sites:
        name, line = site.rsplit(":", 1)
        (path,) = [p for p in (REPO / "engine").rglob(name)]
        text = path.read_text().splitlines()[int(line) - 1]
        assert op.split("_")[0] in text or "dist." in text, (site, text)
        assert _defining_function(path, int(line)) == function, (site, function)


def test_the_pictures_paragraph_cites_the_sample_s_sites():
    """docs/consensus.md's screenshots of the 30760 run are described in words: the sites those
    words cite are the recorded sample's (they had drifted to lines the engine no longer has)."""
    result = json.loads(FIXTURE.read_text())
    (bug,) = [v for v in result["variants"] if v["first_divergence"]]
    doc = (REPO / "docs" / "consensus.md").read_text()
    paragraph = doc[doc.index("`hctool repro 30760 --variant per-poll`") : doc.index("## Several hosts")]
    for entry in bug["first_divergence"]["ranks"].values():
        assert entry["site"] in paragraph and entry["function"] in paragraph, entry["site"]
    for cited in re.findall(r"\b(\w+\.py:\d+)", paragraph):
        assert cited in {e["site"] for e in bug["first_divergence"]["ranks"].values()}, cited


def _rewrite(text: str, begin: str, body: str) -> str:
    head, rest = text.split(begin, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{begin}\n```\n{body}\n```\n{END}{tail}"


if __name__ == "__main__":
    text = (REPO / "README.md").read_text()
    text = _rewrite(text, BEGIN, rendered())
    text = _rewrite(text, CHECK_BEGIN, rendered_check())
    (REPO / "README.md").write_text(text)
    print(re.sub(r"\s+$", "", rendered()))
    print(re.sub(r"\s+$", "", rendered_check()))

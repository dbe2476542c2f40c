"""The three walls (docs/architecture.md): the engine's one surface (engine.lab), the in-rank
agent (hctool/agent), the shared protocol (hctool/protocol). Read from the source: a new
import across a wall fails here, before it blinds a tool at run time."""

from __future__ import annotations

import ast
import re
import sys

import pytest

from tests.walls.imports import REPO, cycles, graph, imports, modules

STDLIB = set(sys.stdlib_module_names)


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def _outside_lab(name: str) -> bool:
    return name.startswith("engine.") and not (name == "engine.lab" or name.startswith("engine.lab."))


def test_no_import_cycles_in_the_house():
    """Counting imports inside functions, and a package's __init__ as imported by whoever imports
    one of its modules (it runs first)."""
    assert cycles(graph(module_level_only=False)) == []


def test_the_tool_reaches_the_engine_only_through_engine_lab():
    bad = {
        m: sorted(i for i in imports(p, m) if i == "engine" or _outside_lab(i))
        for m, p in modules().items()
        if m.startswith(("hctool", "repros"))
    }
    assert {m: v for m, v in bad.items() if v} == {}


def test_no_engine_module_is_named_in_a_string_outside_engine_lab():
    """when_imported("engine.x") or python -m engine.x would be an import by another name."""
    pattern = re.compile(r"^engine\.(?!lab\b)[a-z_.]+(:[A-Za-z_.]+)?$")
    found = []
    for m, p in modules().items():
        if not m.startswith(("hctool", "repros")):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value):
                found.append(f"{m}: {node.value!r}")
    assert found == []


def test_the_engine_never_imports_hctool():
    bad = {
        m: sorted(i for i in imports(p, m) if _top(i) == "hctool")
        for m, p in modules().items()
        if m.startswith("engine")
    }
    assert {m: v for m, v in bad.items() if v} == {}


@pytest.mark.parametrize(
    "package, allowed",
    [
        # in-rank code: stdlib, torch, the protocol, its own modules, the engine's surface
        ("hctool.agent", ("torch", "hctool.agent", "hctool.protocol", "engine.lab")),
        # what both sides read: stdlib only
        ("hctool.protocol", ("hctool.protocol",)),
    ],
)
def test_agent_and_protocol_import_only_what_they_may(package, allowed):
    bad = {}
    for m, p in modules().items():
        if m != package and not m.startswith(package + "."):
            continue
        wrong = sorted(
            i
            for i in imports(p, m)
            if _top(i) not in STDLIB
            and _top(i) != "__future__"
            and i != "hctool"  # sitecustomize checks the package is importable
            and not any(i == a or i.startswith(a + ".") for a in allowed)
        )
        if wrong:
            bad[m] = wrong
    assert bad == {}


def test_the_supervisor_never_imports_the_agent_in_process():
    """The supervisor may name agent files (paths, -m) but runs none of the agent's code."""
    # Exempt: hctool.consensus re-exports the in-rank API (assert_same) lazily, for user code in
    # ranks; the pytest plugin's worker is its in-rank half (it runs inside each rank process).
    exempt = ("hctool.agent", "hctool.consensus", "hctool.pytest_plugin.worker")
    bad = {
        m: sorted(i for i in imports(p, m) if i.startswith("hctool.agent"))
        for m, p in modules().items()
        if m.startswith("hctool") and m not in exempt and not m.startswith("hctool.agent.")
    }
    assert {m: v for m, v in bad.items() if v} == {}


def test_every_hctool_env_name_is_declared_in_the_protocol():
    from hctool.protocol import env

    declared = set(env.ALL)
    used = set()
    for path in list((REPO / "hctool").rglob("*.py")) + list((REPO / "engine").rglob("*.py")):
        used |= set(re.findall(r"\bHCTOOL_[A-Z0-9_]+\b", path.read_text()))
    # compile-time macros of the C sources and internal names are not environment variables
    assert used - declared - {"HCTOOL_DIR", "HCTOOL_TORCH_VERSION"} == set()


# Who may build on whom inside the tool: a package never imports one listed after it here
# (the commands sit on everything; report renders consensus's results; the supervisor and the
# console serve every runner and know none of them).
LAYERS = {
    "hctool.console": ("hctool.supervise", "hctool.consensus", "hctool.chaos", "hctool.repro", "hctool.report"),
    "hctool.supervise": ("hctool.consensus", "hctool.chaos", "hctool.repro", "hctool.report", "hctool.lint"),
    "hctool.consensus": ("hctool.report", "hctool.chaos", "hctool.repro", "hctool.commands", "hctool.gate"),
    "hctool.chaos": ("hctool.report", "hctool.commands", "hctool.gate"),
    "hctool.repro": ("hctool.report", "hctool.chaos", "hctool.commands", "hctool.gate"),
    "hctool.report": ("hctool.commands", "hctool.gate"),
}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_upward_edge(package):
    below = LAYERS[package]
    bad = {
        m: sorted(i for i in imports(p, m) if i.startswith(below) or i in below)
        for m, p in modules().items()
        if m == package or m.startswith(package + ".")
    }
    assert {m: v for m, v in bad.items() if v} == {}

"""Structural validators, no extra dependencies.

junit_errors: the JUnit XML schema that Jenkins publishes (junit-10.xsd, the Ant
format extended with skipped), which GitHub's test-report actions and GitLab's
`artifacts:reports:junit` parse: which elements may appear where, which
attributes each may carry, which are required, their value types, and that the
counts on each suite match its test cases.

sarif_errors: what SARIF 2.1.0's schema requires of a log: version, runs, each
run's tool.driver.name, each result's message (text or id), levels from the
enum, locations with artifact URIs and 1-based regions, rule ids that exist.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime

DECIMAL = re.compile(r"^-?\d+(\.\d+)?$")
INT = re.compile(r"^\d+$")

# element -> (required attrs, optional attrs, allowed children)
JUNIT = {
    "testsuites": (set(), {"name", "time", "tests", "failures", "errors", "disabled", "skipped"}, {"testsuite"}),
    "testsuite": (
        {"name", "tests"},
        {
            "failures",
            "errors",
            "time",
            "disabled",
            "skipped",
            "timestamp",
            "hostname",
            "id",
            "package",
            "file",
            "log",
            "url",
            "version",
            "group",
        },
        {"properties", "testcase", "system-out", "system-err"},
    ),
    "properties": (set(), set(), {"property"}),
    "property": ({"name", "value"}, set(), set()),
    "testcase": (
        {"name"},
        {"assertions", "time", "classname", "status", "class", "file", "line", "log", "group", "url"},
        {"skipped", "error", "failure", "system-out", "system-err"},
    ),
    "failure": (set(), {"message", "type"}, set()),
    "error": (set(), {"message", "type"}, set()),
    "skipped": (set(), {"message"}, set()),
    "system-out": (set(), set(), set()),
    "system-err": (set(), set(), set()),
}
_NUMERIC = {
    "time": DECIMAL,
    "tests": INT,
    "failures": INT,
    "errors": INT,
    "skipped": INT,
    "disabled": INT,
    "line": INT,
    "assertions": INT,
}


def junit_errors(text: str) -> list[str]:
    try:
        root = ET.fromstring(text.encode() if isinstance(text, str) else text)
    except ET.ParseError as exc:
        return [f"not well-formed XML: {exc}"]
    errors: list[str] = []
    if root.tag not in ("testsuites", "testsuite"):
        errors.append(f"root element is <{root.tag}>, expected <testsuites> or <testsuite>")

    def visit(el: ET.Element, path: str) -> None:
        spec = JUNIT.get(el.tag)
        if spec is None:
            errors.append(f"{path}: unknown element <{el.tag}>")
            return
        required, optional, children = spec
        for a in required - set(el.attrib):
            errors.append(f"{path}: missing required attribute {a!r}")
        for a, v in el.attrib.items():
            if a not in required | optional:
                errors.append(f"{path}: attribute {a!r} not allowed on <{el.tag}>")
            elif a in _NUMERIC and not _NUMERIC[a].match(v):
                errors.append(f"{path}: attribute {a}={v!r} is not a number")
        if el.tag == "testsuite" and "timestamp" in el.attrib:
            try:
                datetime.fromisoformat(el.attrib["timestamp"])
            except ValueError:
                errors.append(f"{path}: timestamp {el.attrib['timestamp']!r} is not an xs:dateTime")
        if el.tag == "testcase" and len([c for c in el if c.tag in ("failure", "error", "skipped")]) > 1:
            errors.append(f"{path}: more than one outcome element")
        if el.tag == "testsuite":
            cases = el.findall("testcase")
            want = {
                "tests": len(cases),
                "failures": sum(c.find("failure") is not None for c in cases),
                "errors": sum(c.find("error") is not None for c in cases),
                "skipped": sum(c.find("skipped") is not None for c in cases),
            }
            for k, n in want.items():
                if k in el.attrib and INT.match(el.attrib[k]) and int(el.attrib[k]) != n:
                    errors.append(f"{path}: {k}={el.attrib[k]} but the suite holds {n}")
        if el.tag == "property" and (el.text or "").strip():
            errors.append(f"{path}: <property> must be empty")
        for i, child in enumerate(el):
            if child.tag not in children:
                errors.append(f"{path}: <{child.tag}> not allowed in <{el.tag}>")
            visit(child, f"{path}/{child.tag}[{i}]")

    visit(root, root.tag)
    return errors


LEVELS = {"none", "note", "warning", "error"}


def sarif_errors(doc: dict) -> list[str]:
    errors: list[str] = []
    if not isinstance(doc, dict):
        return ["a SARIF log is a JSON object"]
    if doc.get("version") != "2.1.0":
        errors.append(f"version is {doc.get('version')!r}, must be '2.1.0'")
    if "$schema" in doc and not isinstance(doc["$schema"], str):
        errors.append("$schema must be a string (URI)")
    runs = doc.get("runs")
    if not isinstance(runs, list):
        return errors + ["runs must be an array"]
    for i, run in enumerate(runs):
        driver = (run.get("tool") or {}).get("driver") if isinstance(run, dict) else None
        if not isinstance(driver, dict) or not isinstance(driver.get("name"), str) or not driver["name"]:
            errors.append(f"runs[{i}].tool.driver.name is required")
            continue
        rule_ids = []
        for j, rule in enumerate(driver.get("rules", [])):
            if not isinstance(rule.get("id"), str):
                errors.append(f"runs[{i}].tool.driver.rules[{j}].id is required")
            rule_ids.append(rule.get("id"))
        for j, res in enumerate(run.get("results", [])):
            where = f"runs[{i}].results[{j}]"
            msg = res.get("message")
            if not isinstance(msg, dict) or not (isinstance(msg.get("text"), str) or isinstance(msg.get("id"), str)):
                errors.append(f"{where}.message needs text or id")
            if "level" in res and res["level"] not in LEVELS:
                errors.append(f"{where}.level {res['level']!r} not in {sorted(LEVELS)}")
            if "ruleIndex" in res and not (isinstance(res["ruleIndex"], int) and 0 <= res["ruleIndex"] < len(rule_ids)):
                errors.append(f"{where}.ruleIndex {res['ruleIndex']!r} does not index tool.driver.rules")
            elif "ruleIndex" in res and res.get("ruleId") not in (None, rule_ids[res["ruleIndex"]]):
                errors.append(f"{where}.ruleId {res.get('ruleId')!r} differs from rules[{res['ruleIndex']}]")
            for k, loc in enumerate(res.get("locations", []) + res.get("relatedLocations", [])):
                phys = loc.get("physicalLocation", {})
                uri = phys.get("artifactLocation", {}).get("uri")
                if not isinstance(uri, str) or not uri:
                    errors.append(f"{where} location {k}: artifactLocation.uri is required")
                region = phys.get("region", {})
                for key in ("startLine", "startColumn", "endLine", "endColumn"):
                    if key in region and not (isinstance(region[key], int) and region[key] >= 1):
                        errors.append(f"{where} location {k}: region.{key} must be an integer >= 1")
    return errors

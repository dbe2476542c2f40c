"""Classes the linted tree never builds (issue 34: SGLang's HiRadixCache at d315eb72, which the cache
factory no longer constructs; the tree still names it, but only as a type).

A finding whose source sits in a method of such a class describes code that does not run: the class is
never called, subclassed, passed or stored as a value, re-exported, or named in a string a registry could
look up, anywhere in the tree, and the tree does name it as a type (an annotation, an import under
`if TYPE_CHECKING:`). Requiring that last part keeps a library's public class that only outside scripts
build (never named in the tree at all) a class whose findings are reported.

Asked only for the few classes that hold a finding's source, after the findings are made: the files that
mention the class's name (a byte search) are parsed again, nothing else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hctool.lint.source import read_source


def _type_checking(test) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Uses(ast.NodeVisitor):
    """The ways one module names NAME: `runtime` (a value use), `typed` (an annotation, a type-checking import)."""

    def __init__(self, name: str, own_class: ast.ClassDef | None, init: bool):
        self.name, self.own_class, self.init = name, own_class, init
        self.runtime = False
        self.typed = False
        self._typing = 0

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node is self.own_class:  # its own body's references to itself build nothing
            for b in (*node.bases, *node.decorator_list):
                self.visit(b)
            return
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if _type_checking(node.test):
            self._typing += 1
            for s in node.body:
                self.visit(s)
            self._typing -= 1
            for s in node.orelse:
                self.visit(s)
            return
        self.generic_visit(node)

    def _annotation(self, node) -> None:
        if node is not None:
            self._typing += 1
            self.visit(node)
            self._typing -= 1

    def visit_arg(self, node: ast.arg) -> None:
        self._annotation(node.annotation)

    def visit_FunctionDef(self, node) -> None:
        for d in node.decorator_list:
            self.visit(d)
        self.visit(node.args)
        self._annotation(node.returns)
        for s in node.body:
            self.visit(s)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._annotation(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def _named(self) -> None:
        if self._typing:
            self.typed = True
        else:
            self.runtime = True

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == self.name:
            self._named()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == self.name:
            self._named()
        self.visit(node.value)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for a in node.names:
            if a.name == self.name:
                # a package's re-export is its public surface; any other import counts by how it is used
                if self._typing:
                    self.typed = True
                elif self.init:
                    self.runtime = True

    def visit_Constant(self, node: ast.Constant) -> None:
        # a registry key or a dotted path (`"pkg.mod.Name"`), not prose that mentions it
        if isinstance(node.value, str) and (node.value == self.name or node.value.endswith("." + self.name)):
            self._named()  # in an annotation (`cache: "OldCache"`), a forward reference: a type


def unbuilt(classes: set[tuple[str, str]], files: dict[str, str]) -> set[tuple[str, str]]:
    """Of CLASSES ((display path of its module, class name)), those the tree FILES (display path -> the
    file to read) names only as a type."""
    if not classes:
        return set()
    names = {n for _, n in classes}
    words = {n: (n.encode(), re.compile(rb"\b" + re.escape(n.encode()) + rb"\b")) for n in sorted(names)}
    mentions: dict[str, list[str]] = {n: [] for n in names}
    texts: dict[str, bytes] = {}  # the bytes of the files that mention one of the names, read once
    for f, real in files.items():
        try:
            data = read_source(real)
        except OSError:
            return set()  # a file not read is a use not seen: claim nothing
        for n, (raw, word) in words.items():
            if raw in data and word.search(data):  # a substring test first: most files never mention it
                mentions[n].append(f)
                texts[f] = data
    out = set()
    trees: dict = {}
    for path, name in classes:
        runtime = typed = False
        # Files likeliest to build it first (its own module, then a call or a subclass of the name): a
        # class built anywhere is known after one parse, not after every file that types against it.
        built = re.compile(rb"\b" + re.escape(name.encode()) + rb"\s*[(),]")
        order = sorted(mentions[name], key=lambda f: (f != path, not built.search(texts[f])))
        for f in order:
            tree = trees.get(f)
            if tree is None:
                try:
                    tree = trees[f] = ast.parse(texts[f], filename=f)
                except (SyntaxError, ValueError, RecursionError):
                    runtime = True  # not seen: not claimed unbuilt
                    break
            own = (
                next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
                if f == path
                else None
            )
            uses = _Uses(name, own, Path(f).name == "__init__.py")
            uses.visit(tree)
            runtime |= uses.runtime
            typed |= uses.typed and f != path
            if runtime:
                break
        if typed and not runtime:
            out.add((path, name))
    return out

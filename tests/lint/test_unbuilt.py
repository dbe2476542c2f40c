"""A class the tree names only as a type, and never builds, holds no findings (unbuilt.py; issue 34:
SGLang's HiRadixCache at d315eb72). Its twins, built, subclassed, re-exported or looked up by name,
keep theirs."""

from __future__ import annotations

from .test_rules import check

CACHE = """
class {name}:
    def check_progress(self, finish_event):
        if not finish_event.query():  # expect: HC103
            return False
        dist.all_reduce(torch.ones(1))  # gated
        return True
"""


def _cache(name: str, expect: bool) -> str:
    text = CACHE.format(name=name)
    return text if expect else text.replace("  # expect: HC103", "").replace("  # gated", "")


def test_a_class_named_only_as_a_type_holds_no_findings(lint_snippets):
    check(
        lint_snippets,
        {
            "old_cache.py": _cache("OldCache", expect=False),
            "assembler.py": """
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from old_cache import OldCache

def attach(cache: "OldCache") -> None:
    '''Attach pools to an OldCache.'''
    cache.pools = []
""",
        },
    )


def test_a_class_built_subclassed_exported_or_registered_keeps_them(lint_snippets):
    check(
        lint_snippets,
        {
            "built.py": _cache("BuiltCache", expect=True),
            "base.py": _cache("BaseCache", expect=True),
            "exported.py": _cache("ExportedCache", expect=True),
            "registered.py": _cache("RegisteredCache", expect=True),
            "never_named.py": _cache("NeverNamedCache", expect=True),
            "factory.py": """
from typing import TYPE_CHECKING

from base import BaseCache
from built import BuiltCache

if TYPE_CHECKING:
    from exported import ExportedCache
    from registered import RegisteredCache

class Child(BaseCache):
    pass

def make(kind: "ExportedCache | RegisteredCache") -> BuiltCache:
    registry = {"registered": "registered.RegisteredCache"}
    return BuiltCache()
""",
            "__init__.py": "from exported import ExportedCache\n",
        },
    )

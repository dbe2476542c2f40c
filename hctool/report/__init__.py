"""The HTML report of a run folder (`hctool report`), and the hook the runners call.

write_run_report(run_dir, document) -> Path | None   at the end of repro, chaos and
    check-consensus run: writes RUN_DIR/report.html, names it on stderr, never raises
build_html(run_dir, document=None) -> str           one self-contained page
"""

from __future__ import annotations

from pathlib import Path

REPORT_NAME = "report.html"


def build_html(run_dir, document: dict | None = None) -> str:
    from hctool.report.page import build

    return build(Path(run_dir), document)


def write_run_report(run_dir, document: dict | None = None) -> Path | None:
    """The runners' hook: a report that cannot be made is one line on stderr, never a failed run."""
    import time

    from hctool.console import log

    out = Path(run_dir) / REPORT_NAME
    t0 = time.monotonic()
    try:
        from hctool.protocol.safefile import write_atomic

        write_atomic(out, build_html(run_dir, document).encode("utf-8"))  # never through a planted link
        log.debug(f"hctool: report.html made in {time.monotonic() - t0:.2f} s ({out.stat().st_size >> 10} KiB)")
    except Exception as exc:  # the run's own result stands whatever happens here
        log.warning(f"hctool: no HTML report: {_why(exc, out)}")
        return None
    log.info(f"hctool: report in {out}")
    return out


def _why(exc: Exception, out: Path) -> str:
    """Why the page was not made, in words: a folder or trace it cannot read says so itself; a
    file it cannot read or write, the system's reason; anything else is hctool's own fault."""
    import os
    import traceback

    from hctool.consensus.trace import TraceError
    from hctool.protocol.env import DEBUG
    from hctool.report.folders import FolderError

    if isinstance(exc, (FolderError, TraceError)):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{exc.filename or out}: {exc.strerror or exc}"
    if os.environ.get(DEBUG):
        traceback.print_exception(exc)
    return f"hctool failed while drawing it ({exc or 'no message'}); HCTOOL_DEBUG=1 shows where"

"""The HTML report in a real browser: headless Chromium (Debian's package) opens
the file offline, the page shows the verdict and the culprit rank's call site,
its script runs without a console error, and a screenshot is taken."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.consensus.helpers import site
from tests.report.browser import Browser, find_chromium

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium installed (apt-get install chromium; .ci/run installs it): the report's browser test needs one",
)


def test_check_consensus_run_writes_the_report(vote_run):
    folder, _, stderr = vote_run
    assert f"hctool: report in {folder / 'report.html'}" in stderr
    page = (folder / "report.html").read_text()
    assert "<script>" in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page


@needs_chromium
def test_report_in_headless_chromium(vote_run, tmp_path):
    folder, report, _ = vote_run
    vote = site("vote_loop.py", "vote")
    with Browser() as browser:
        page = browser.open((folder / "report.html").as_uri())
        assert page.eval("document.getElementById('verdict').textContent") == "diverged"
        culprit = page.eval(
            "Array.from(document.querySelectorAll('table.divergence tr.culprit'))"
            ".map(r => [r.dataset.rank, r.querySelector('td.site').textContent])"
        )
        assert culprit == [["0", vote]]
        # the calls aligned by seq: rank 0's cell at the divergent seq names the vote's site
        at = page.eval(
            "Array.from(document.querySelectorAll('table.seq-lanes tr[data-rank=\"0\"] td.at .cell-site'))"
            ".map(s => s.textContent)"
        )
        assert vote in at
        assert page.eval("document.querySelectorAll('svg.timeline rect.call.div').length") >= 2
        # the script ran: clicking a call outlines it and its partner on the other rank, with details
        page.eval(
            "document.querySelector('svg.timeline rect.call.div').dispatchEvent(new "
            "MouseEvent('click', {bubbles: true}))"
        )
        assert page.eval("document.querySelectorAll('rect.call.sel').length") == 2
        assert vote in page.eval("document.getElementById('detail').textContent")
        assert page.eval("document.body.dataset.ready") == "1"
        shot = page.screenshot(tmp_path / "report.png")
        assert page.console_errors() == []
        assert [u for u in page.requests() if not u.startswith(("file:", "data:"))] == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_report_command(vote_run, tmp_path):
    folder, _, _ = vote_run
    out = tmp_path / "r.html"
    proc = subprocess.run(
        [sys.executable, "-m", "hctool", "report", str(folder), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr.strip() == f"hctool: report in {out}"
    html = out.read_text()
    assert 'id="verdict">diverged<' in html and site("vote_loop.py", "vote") in html
    bad = subprocess.run(
        [sys.executable, "-m", "hctool", "report", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("Error: ") and "Traceback" not in bad.stderr

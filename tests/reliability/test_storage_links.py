"""Links planted in a shared L3 storage folder: a rank never writes through one and never reads
a page through one. Page files of a real `hctool launch --tp 2` are replaced by links to copies
outside the folder (before: served from there), and links are planted at the temporary names
the ranks used to write pages under (`<page>.tmp<pid>`: before, the page overwrote the victim).
Every answer must equal the uncached one, each planted page link is a counted, logged refusal,
the pages are rewritten as regular files, and the victims come out unchanged."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from tests.reliability.helpers import REPO, Server, child_env
from tests.reliability.test_storage_integrity import _prompts, flush, metric, pages, storage_flags, wait_pages, wave

VICTIM = b"the victim's own bytes\n"


def test_links_in_the_storage_folder_are_refused_never_followed(tmp_path):
    store, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    srv = Server(tmp_path / "run", *storage_flags(store))
    try:
        url = srv.wait_ready()
        prompts = _prompts(5)
        reference = [a["output_ids"] for a in wave(url, prompts)]
        wait_pages(store, len(prompts) * 6 * 2)
        flush(url)
        pids = {r: srv.rank_pid(r) for r in (0, 1)}
        files = pages(store)
        linked, planted = files[0::2], files[1::2]
        for f in linked:  # the page resolves outside the folder: a copy there, a link here
            copy = outside / f.name
            copy.write_bytes(f.read_bytes())
            f.unlink()
            f.symlink_to(copy)
        victims = []
        for f in planted:  # the page is gone; its old temporary name points at a victim
            rank = int(re.search(r"_tp2_(\d+)\.bin$", f.name)[1])
            victim = outside / f"victim-{f.name}"
            victim.write_bytes(VICTIM)
            f.unlink()
            (store / f"{f.name}.tmp{pids[rank]}").symlink_to(victim)
            victims.append(victim)

        second = wave(url, prompts)
        assert [a["output_ids"] for a in second] == reference
        assert sum(a["meta_info"]["cached_tokens_details"]["storage"] for a in second) == 0, (
            "a page was served through a link"
        )
        wait_pages(store, len(files))
        deadline = time.monotonic() + 60  # every page is a regular file again
        while any(f.is_symlink() or not f.is_file() for f in files):
            assert time.monotonic() < deadline, [f.name for f in files if f.is_symlink()]
            time.sleep(0.1)
        assert metric(url, "hicache_storage_corrupt_pages_total") >= len(linked) // 2  # the most any rank found
        assert "rejected (a symbolic link, not a page file)" in srv.log()
        assert all(v.read_bytes() == VICTIM for v in victims), "a page was written through a planted link"
        assert all((outside / f.name).read_bytes()[:4] == b"HCKV" for f in linked)

        flush(url)  # the rewritten pages serve
        third = wave(url, prompts)
        assert [a["output_ids"] for a in third] == reference
        assert sum(a["meta_info"]["cached_tokens_details"]["storage"] for a in third) > 0
    finally:
        srv.close()


def test_the_storage_check_writes_no_file_through_a_planted_link(tmp_path):
    store, victim = tmp_path / "store", tmp_path / "victim"
    store.mkdir()
    victim.write_bytes(VICTIM)
    code = (
        "import os, sys\n"
        f"os.symlink({str(victim)!r}, os.path.join({str(store)!r}, f'.hctool-probe-{{os.getpid()}}'))\n"
        "from engine.lab import check_storage_dir\n"
        f"check_storage_dir({str(store)!r}); print('checked')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "checked" in done.stdout, done.stderr
    assert victim.read_bytes() == VICTIM
    assert not [n for n in os.listdir(store) if not n.startswith(".hctool-probe-")]

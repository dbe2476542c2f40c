"""The one rule for hctool's cache folders (HCTOOL_CACHE_DIR, default ~/.cache/hctool): what is
read from a cache runs as the user (the C++ kernel is loaded into every rank, chaos reference
answers decide a verdict, lint's entries are pickles), so a cache folder is used only when it is
the user's own and nobody else can write into it:

- the top folder: owned by the user and not writable by others (group-writable is allowed: a
  user-private group under umask 002 makes it so);
- every folder hctool makes under it: owned by the user, a real folder (not a link), writable by
  the user alone (made 0700 whatever the umask);
- an entry read from it: a regular file owned by the user and writable by the user alone.

A cache is an optimisation, so a folder that breaks the rule, cannot be made (the top is a file,
read-only, ...) is bypassed: `folder()` returns None and one line saying why, and the caller
works without it. lint refuses instead (hctool/lint/cache.py, its own message, the same rule).
Standard library only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hctool.protocol.env import CACHE_DIR, cache_root

HINT = f"set {CACHE_DIR} to a folder of your own that only you can write, or {CACHE_DIR}=off"


def _mine(st: os.stat_result) -> bool:
    return not hasattr(os, "getuid") or st.st_uid == os.getuid()


def unsafe(path: Path, top: bool = False) -> str | None:
    """Why the folder `path` must not be used (None: it may). top: the cache root, which may be
    a link the user made and group-writable."""
    return _unsafe(
        path, stat.S_ISDIR, "a folder", follow=top, others=stat.S_IWOTH if top else stat.S_IWGRP | stat.S_IWOTH
    )


def unsafe_entry(path: Path) -> str | None:
    """Why the file `path` in a cache folder must not be read (None: it may)."""
    return _unsafe(path, stat.S_ISREG, "a regular file", follow=False, others=stat.S_IWGRP | stat.S_IWOTH)


def _unsafe(path: Path, kind, what: str, follow: bool, others: int) -> str | None:
    """One rule for folders and entries: of the right kind, yours, and nobody else may write it."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not kind(st.st_mode):
        return f"{path} is not {what}"
    if not _mine(st):
        return f"{path} is not yours (owner uid {st.st_uid})"
    if st.st_mode & others:
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def folder(*parts: str, create: bool = True) -> tuple[Path | None, str]:
    """(ROOT/parts..., "") when every folder on the way follows the rule (made, 0700, when
    missing and `create`), else (None, one line why: the cache is bypassed). A missing folder
    with create=False, or HCTOOL_CACHE_DIR=off, is (None, ""): a plain miss."""
    root = cache_root()
    if root is None:  # HCTOOL_CACHE_DIR=off: no cache, asked for; nothing to say
        return None, ""
    try:
        if create:
            root.mkdir(parents=True, exist_ok=True)  # the user's folder, made under their umask
    except OSError as exc:  # a file, a read-only filesystem, a folder we may not enter
        what = unsafe(root, top=True) if root.exists() else None
        return None, f"not using the cache: {what or f'{root} cannot be made ({exc.strerror})'}; {HINT}"
    if not create and not root.exists():
        return None, ""
    why = unsafe(root, top=True)
    if why:
        return None, f"not using the cache: {why}; {HINT}"
    here = root
    for part in parts:
        here = here / part
        if create:
            try:
                here.mkdir(mode=0o700)
            except FileExistsError:
                pass
            except OSError as exc:  # read-only, full
                return None, f"not using the cache: {here} cannot be made ({exc.strerror}); {HINT}"
        elif not os.path.lexists(here):
            return None, ""
        why = unsafe(here)
        if why:
            return None, f"not using the cache: {why}; {HINT}"
    return here, ""

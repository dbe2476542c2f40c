"""Building the C++ capture kernel (hctool/agent/capture/_c10d_kernel.cpp; docs/consensus.md,
"Coverage"), on the supervisor's side.

`check-consensus run` builds it once per (source, torch, Python, compiler) into a cache
folder before it starts the ranks, in a child process (the CLI never imports torch), and
passes its path in HCTOOL_C10D_KERNEL; each rank loads it when torch.distributed is
imported (agent/capture/cxx_kernel.py). Without a C++ compiler, or with HCTOOL_C10D_KERNEL=0,
C++-issued calls go through agent/capture/c10d.py's Python kernel: the same records, at a
higher cost per call.

    python -m hctool.consensus.kernel_build OUT.so TMP   # the build itself (imports torch)
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from hctool.protocol import cachedir
from hctool.protocol import env as protocol_env
from hctool.supervise import procs

SOURCE = Path(__file__).resolve().parents[1] / "agent" / "capture" / "_c10d_kernel.cpp"
ENV = protocol_env.C10D_KERNEL
BUILD_TIMEOUT_S = 600.0


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def cache_dir() -> Path | None:
    return protocol_env.cache_root()


def _torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")  # found, not imported
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def _key_name() -> str | None:
    """The cache folder's name for this source, recipe, Python, torch and compiler (None: no torch
    or compiler)."""
    torch_dir, cxx = _torch_dir(), compiler()
    if torch_dir is None or cxx is None:
        return None
    try:
        version = (torch_dir / "version.py").read_text()
    except OSError:
        version = ""
    key = hashlib.sha256()
    recipe = Path(__file__).read_bytes()  # how it is built: a changed recipe builds again
    for part in (
        SOURCE.read_bytes(),
        recipe,
        version.encode(),
        str(torch_dir).encode(),
        sys.version.encode(),
        cxx.encode(),
    ):
        key.update(part)
        key.update(b"\0")
    return f"c10d-{key.hexdigest()[:16]}"


MODULE_NAME = "_c10d_kernel" + sysconfig.get_config_var("EXT_SUFFIX")


def target() -> Path | None:
    """Where the build for this Python, torch and compiler lives (None: no torch, compiler or cache)."""
    name, root = _key_name(), cache_dir()
    return None if name is None or root is None else root / name / MODULE_NAME


def ensure_built(log=None, timeout: float | None = None) -> tuple[Path | None, str]:
    """(path of the built module, "") or (None, why not). Builds on a cache miss, within
    `timeout` seconds (the command's time left; BUILD_TIMEOUT_S at most).

    The build runs in a child in its own process group under the lifeline (it and the compiler
    die with hctool, even on SIGKILL), into a temporary file this side made: on a timeout or any
    signal here the whole group is killed and the file removed, so no compiler is left running
    and no partial .so stays in the cache."""
    if os.environ.get(ENV) == "0":
        return None, f"{ENV}=0"
    if cache_dir() is None:
        return None, f"{protocol_env.CACHE_DIR}=off (the build is kept in the cache)"
    name = _key_name()
    if name is None:
        return None, "no C++ compiler (set CXX)" if compiler() is None else "torch is not importable here"
    # The module is loaded into every rank: a cache folder someone else owns or can write into
    # is not used (a .so planted there ran its constructor in the ranks), nor one that cannot
    # be made (HCTOOL_CACHE_DIR a file, read-only: the run goes on with the Python kernel).
    where, why = cachedir.folder(name)
    if where is None:
        return None, why
    out = where / MODULE_NAME
    if os.path.lexists(out):
        bad = cachedir.unsafe_entry(out)
        if bad is None:
            return out, ""
        if log is not None:  # ours to replace: the folder is private, the entry is not what we built
            log(f"ignoring the cached C++ kernel ({bad}); building it again")
        with contextlib.suppress(OSError):
            os.unlink(out)
    limit = BUILD_TIMEOUT_S if timeout is None else max(0.0, min(BUILD_TIMEOUT_S, timeout))
    if log is not None:
        log(f"building the C++ capture kernel for this torch (once; cached in {out.parent})")
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hctool.consensus.kernel_build", str(out), tmp],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=procs.inject_env(dict(os.environ)),
        )
        try:
            stdout, stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None, f"the build took over {limit:.0f} s (the command's deadline)"
        except BaseException:  # Ctrl-C, SIGTERM (as KeyboardInterrupt): the compiler goes too
            _kill_group(proc)
            raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        shutil.rmtree(work_dir(Path(tmp)), ignore_errors=True)  # the objects of a build done or killed
    if proc.returncode != 0 or not out.exists():
        lines = (
            [ln for ln in (stderr + stdout).splitlines() if "error" in ln.lower()]
            or (stderr + stdout).strip().splitlines()
            or ["no output"]
        )
        return None, f"the build failed: {lines[0][:300]}"
    return out, ""


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the build and every compiler process it started
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=10)


def work_dir(tmp: Path) -> Path:
    """The build's scratch folder beside its temporary file (the parent removes both)."""
    return tmp.with_name(tmp.name + ".d")


def build(out: Path, tmp: Path) -> None:
    """Compile _c10d_kernel.cpp against the torch imported here into `tmp`, then rename it to OUT.

    torch.utils.cpp_extension's own recipe (CppExtension + BuildExtension, as a setup.py builds
    an extension): torch's include folders and libraries, its C++ standard, its C++ ABI and its
    pybind11 ABI (so types cross between torch's module and this one), whatever this torch needs.
    Setuptools' compiler driver, not ninja: nothing to fetch, nothing beyond a C++ compiler."""
    import torch
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    lib = Path(torch.__file__).parent / "lib"
    version = torch.__version__.split("+")[0]
    extension = CppExtension(
        "_c10d_kernel",
        [str(SOURCE)],
        # -g0: Python's own CFLAGS (which setuptools passes) carry -g, 8 MB of debug data in every rank
        extra_compile_args=["-O2", "-g0", "-w", f'-DHCTOOL_TORCH_VERSION="{version}"'],
        extra_link_args=[f"-Wl,-rpath,{lib}"],  # the ranks load it without torch's lib on LD_LIBRARY_PATH
    )
    work = work_dir(tmp)
    try:
        setup(
            name="hctool-c10d-kernel",
            ext_modules=[extension],
            cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
            script_args=["--quiet", "build_ext", "--build-lib", str(work), "--build-temp", str(work / "obj")],
        )
    except Exception as exc:  # torch's compiler check (CXX not a compiler): one line for the parent, no traceback
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(1) from None
    built = work / MODULE_NAME
    if not built.is_file():
        sys.stderr.write(f"error: the build made no {MODULE_NAME}\n")
        raise SystemExit(1)
    shutil.copyfile(built, tmp)
    os.chmod(tmp, 0o755)  # writable by the user alone: the cache rule loads no other (protocol/cachedir.py)
    os.replace(tmp, out)  # concurrent builders: the last whole file wins


def _main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m hctool.consensus.kernel_build OUT.so TMP")
    out, tmp = Path(argv[0]), Path(argv[1])

    def stop(signum, frame):  # the lifeline's SIGTERM (hctool died): no compiler, no partial file left
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        shutil.rmtree(work_dir(tmp), ignore_errors=True)
        os.killpg(0, signal.SIGKILL)  # this process group: the build and its compiler

    signal.signal(signal.SIGTERM, stop)
    build(out, tmp)


if __name__ == "__main__":
    _main(sys.argv[1:])

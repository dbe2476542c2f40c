"""Building the C++ capture kernel (hctool/agent/capture/_c10d_kernel.cpp; docs/consensus.md,
"Coverage"), on the supervisor's side.

`check-consensus run` builds it once per (source, torch, Python, compiler) into a cache
folder before it starts the ranks, in a child process (the CLI never imports torch), and
passes its path in HCTOOL_C10D_KERNEL; each rank loads it when torch.distributed is
imported (agent/capture/cxx_kernel.py). Without a C++ compiler, or with HCTOOL_C10D_KERNEL=0,
C++-issued calls go through agent/capture/c10d.py's Python kernel: the same records, at a
higher cost per call.

    python -m hctool.consensus.kernel_build OUT.so   # the build itself (imports torch)
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

from hctool.protocol import env as protocol_env

SOURCE = Path(__file__).resolve().parents[1] / "agent" / "capture" / "_c10d_kernel.cpp"
ENV = protocol_env.C10D_KERNEL
BUILD_TIMEOUT_S = 600.0


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def cache_dir() -> Path:
    return Path(os.environ.get(protocol_env.CACHE_DIR) or Path.home() / ".cache" / "hctool")


def _torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")  # found, not imported
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def target() -> Path | None:
    """Where the build for this Python, torch and compiler lives (None: no torch or compiler)."""
    torch_dir, cxx = _torch_dir(), compiler()
    if torch_dir is None or cxx is None:
        return None
    try:
        version = (torch_dir / "version.py").read_text()
    except OSError:
        version = ""
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), version.encode(), str(torch_dir).encode(), sys.version.encode(), cxx.encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / f"c10d-{key.hexdigest()[:16]}" / ("_c10d_kernel" + sysconfig.get_config_var("EXT_SUFFIX"))


def ensure_built(log=None) -> tuple[Path | None, str]:
    """(path of the built module, "") or (None, why not). Builds on a cache miss."""
    if os.environ.get(ENV) == "0":
        return None, f"{ENV}=0"
    out = target()
    if out is None:
        return None, "no C++ compiler (set CXX)" if compiler() is None else "torch is not importable here"
    if out.exists():
        return out, ""
    if log is not None:
        log(f"building the C++ capture kernel for this torch (once; cached in {out.parent})")
    try:
        proc = subprocess.run([sys.executable, "-m", "hctool.consensus.kernel_build", str(out)], capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"the build took over {BUILD_TIMEOUT_S:.0f} s"
    if proc.returncode != 0 or not out.exists():
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "error" in ln.lower()] or \
            (proc.stderr + proc.stdout).strip().splitlines() or ["no output"]
        return None, f"the build failed: {lines[0][:300]}"
    return out, ""


def build(out: Path) -> None:
    """Compile _c10d_kernel.cpp against the torch imported here into OUT (atomically)."""
    import torch

    torch_dir = Path(torch.__file__).parent
    lib = torch_dir / "lib"
    try:  # torch's own pybind11 ABI, so types cross between its module and this one (older torch)
        from torch.utils.cpp_extension import _get_pybind11_abi_build_flags as pybind_flags

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            abi_flags = list(pybind_flags())
    except Exception:
        abi_flags = []
    version = torch.__version__.split("+")[0]
    base = [compiler(), "-O2", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f'-DHCTOOL_TORCH_VERSION="{version}"', *abi_flags,
            "-I", str(torch_dir / "include"), "-I", str(torch_dir / "include" / "torch" / "csrc" / "api" / "include"),
            "-I", sysconfig.get_paths()["include"], str(SOURCE),
            "-L", str(lib), "-lc10", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        for std in ("-std=c++17", "-std=c++20"):  # what this torch's headers need
            proc = subprocess.run([*base, std, "-o", tmp], capture_output=True, text=True)
            if proc.returncode == 0:
                os.chmod(tmp, 0o755)
                os.replace(tmp, out)  # concurrent builders: the last whole file wins
                return
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(1)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m hctool.consensus.kernel_build OUT.so")
    build(Path(sys.argv[1]))

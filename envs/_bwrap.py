"""bubblewrap: finding it, checking that it works here, and the command line of one sandbox run.

The sandbox sees a new root of its own: read-only binds of only what the interpreter needs (its
executable, shared library, standard library and extension modules, the system's shared
libraries, time-zone data, and the installed packages only when asked), the runner script, a
size-limited tmpfs as its scratch directory, a minimal /dev and no /proc. Every namespace is new
(user, pid, network, mount, ipc, uts, cgroup): it runs as nobody (65534) with no capabilities,
sees no other process and no network, and dies with its parent; when the run ends its pid
namespace ends, and with it every process the code may have started.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

INSTALL_HINT = ("install bubblewrap (`apt-get install bubblewrap`, `dnf install bubblewrap`, or "
                "`make system-deps`), or pass --unsafe-no-sandbox to run it with in-process guards only")
# Where things are inside the sandbox.
SCRATCH = "/scratch"
RUNNER_PATH = "/sandbox/runner.py"
NOBODY = "65534"
# System library directories the interpreter's extension modules load from (symlinks kept as such).
_LIBRARY_DIRS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/usr/local/lib")


def bwrap_path() -> str | None:
    """The bubblewrap binary: $TRAJFORGE_BWRAP if set, else `bwrap` on PATH (None if neither)."""
    configured = os.environ.get("TRAJFORGE_BWRAP")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)), None)


def interpreter() -> str:
    """The base interpreter (not a venv's launcher): the sandbox binds its installation only."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def read_roots(site_packages: bool) -> tuple[str, ...]:
    """Directories the code may read besides its scratch directory: the standard library and its
    extension modules, time-zone data, and the installed packages when it may import them."""
    paths = sysconfig.get_paths()
    roots = [paths["stdlib"], sysconfig.get_config_var("DESTSHARED") or paths["platstdlib"], "/usr/share/zoneinfo"]
    roots += list(site_dirs(site_packages))
    return tuple(dict.fromkeys(os.path.realpath(r) for r in roots if os.path.exists(r)))


def site_dirs(site_packages: bool) -> tuple[str, ...]:
    if not site_packages:
        return ()
    paths = sysconfig.get_paths()
    return tuple(dict.fromkeys(os.path.realpath(p) for p in (paths["purelib"], paths["platlib"]) if os.path.isdir(p)))


def _interpreter_files() -> list[str]:
    files = [interpreter()]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        if libdir and soname and os.path.exists(os.path.join(libdir, soname)):
            files.append(os.path.realpath(os.path.join(libdir, soname)))
    return files


def command(bwrap: str, runner: Path, run_id: str, *, site_packages: bool, scratch_bytes: int,
            info_fd: int | None = None) -> list[str]:
    """The argv that runs the sandbox runner for one run under bubblewrap. With `info_fd`, bwrap
    writes `{"child-pid": N}` there: N, the sandbox's pid-1, takes every process of the run with it."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", NOBODY, "--gid", NOBODY, "--hostname", "sandbox"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    for directory in _LIBRARY_DIRS:
        if os.path.islink(directory):
            argv += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            argv += ["--ro-bind", directory, directory]
    for path in (*_interpreter_files(), *read_roots(site_packages)):
        argv += ["--ro-bind", path, path]
    argv += ["--ro-bind", str(runner), RUNNER_PATH, "--dev", "/dev",
             "--size", str(scratch_bytes), "--tmpfs", SCRATCH, "--chdir", SCRATCH,
             "--", interpreter(), "-I", "-S", "-B", RUNNER_PATH, run_id]
    return argv


@functools.cache
def problem(bwrap: str) -> str | None:
    """Why bubblewrap cannot run the sandbox on this machine (None when it can): e.g. user
    namespaces are disabled. Checked once per process with a trivial program."""
    argv = command(bwrap, Path(__file__), "probe", site_packages=False, scratch_bytes=1 << 20)
    argv = argv[: argv.index("--") + 1] + [interpreter(), "-I", "-S", "-c", "pass"]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                              start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} does not run ({exc})"
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"{bwrap} cannot create the sandbox here ({said[-1] if said else f'exit {done.returncode}'})"
    return None

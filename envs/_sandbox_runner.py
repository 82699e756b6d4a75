"""The child side of the sandbox: confine this interpreter, run the untrusted code, write a JSON result.

Run as `python -I -S -B _sandbox_runner.py JOB.json` by envs.sandbox; standard library only.
Order matters: everything that needs privileges or files outside the scratch directory
(network namespace, the result file, rlimits) happens before the audit hook is installed,
and the audit hook is installed immediately before the untrusted code runs.
"""

import json
import os
import resource
import signal
import sys
import time

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# Events refused outright: new processes, signals to others, native code, sockets.
_FORBIDDEN_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "os.startfile", "signal.pthread_kill",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function",
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    "os.link", "os.symlink",
})
# Events whose path arguments (by position) must lie inside the scratch directory.
_PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.chmod": (0,),
    "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,),
    "shutil.copytree": (1,), "shutil.move": (1,), "shutil.chown": (0,), "shutil.make_archive": (0,),
}
# Fresh imports refused after setup: re-importing these would undo the patches below.
_FORBIDDEN_IMPORTS = frozenset({"_posixsubprocess", "_ctypes", "ctypes", "_socket", "socket"})
_READ_BLOCKED = ("/proc", "/sys")


class SandboxViolation(PermissionError):
    """Raised in place of a refused operation."""


def _try_netns(isolation):
    """Move this process into an empty network namespace (root only; Linux)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
            isolation.append("netns")
    except Exception:
        pass


def _prctl(isolation):
    """Die with the parent (nothing left running) and never gain privileges through exec."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
            isolation.append("pdeathsig")
        if libc.prctl(38, 1, 0, 0, 0) == 0:  # PR_SET_NO_NEW_PRIVS
            isolation.append("no_new_privs")
    except Exception:
        pass


def _rlimits(job, isolation):
    mb = 1024 * 1024
    limits = {
        "RLIMIT_CPU": (job["cpu_s"], job["cpu_s"] + 1),
        "RLIMIT_AS": (job["memory_mb"] * mb, job["memory_mb"] * mb),
        "RLIMIT_FSIZE": (job["fsize_mb"] * mb, job["fsize_mb"] * mb),
        "RLIMIT_NPROC": (job["nproc"], job["nproc"]),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_NOFILE": (64, 64),
    }
    for name, value in limits.items():
        try:
            resource.setrlimit(getattr(resource, name), value)
            isolation.append(name.lower())
        except (ValueError, OSError, AttributeError):
            pass
    # Past the file-size limit a write fails with EFBIG instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _socket_guard(violations, isolation):
    """Replace socket constructors and helpers with functions that refuse."""
    import socket
    import _socket

    def refuse(*_a, **_k):
        violations.append("network")
        raise SandboxViolation("network access is disabled in the sandbox")

    class _NoSocket(socket.socket):
        def __init__(self, *a, **k):
            refuse()

    for mod in (socket, _socket):
        for attr in ("socket", "SocketType"):
            if hasattr(mod, attr):
                setattr(mod, attr, _NoSocket)
    for attr in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo",
                 "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
        for mod in (socket, _socket):
            if hasattr(mod, attr):
                setattr(mod, attr, refuse)
    isolation.append("socket_guard")


def _process_guard(violations):
    """subprocess forks in C without an audit event; its C entry point refuses instead."""
    import _posixsubprocess
    import subprocess  # noqa: F401  (pre-imported so user imports need no fresh load)

    def refuse(*_a, **_k):
        violations.append("subprocess")
        raise SandboxViolation("starting processes is disabled in the sandbox")

    _posixsubprocess.fork_exec = refuse


def _make_hook(scratch, violations):
    scratch = os.path.realpath(scratch)

    def inside(path):
        if isinstance(path, int):
            return True  # an fd that already passed the open check
        try:
            real = os.path.realpath(os.fsdecode(os.fspath(path)))
        except (TypeError, ValueError):
            return False
        return real == scratch or real.startswith(scratch + os.sep)

    def read_blocked(path):
        if isinstance(path, int):
            return False
        try:
            real = os.path.realpath(os.fsdecode(os.fspath(path)))
        except (TypeError, ValueError):
            return True
        return any(real == p or real.startswith(p + "/") for p in _READ_BLOCKED)

    def refuse(what):
        violations.append(what)
        raise SandboxViolation(f"{what} is not allowed in the sandbox")

    def hook(event, args):
        if event in _FORBIDDEN_EVENTS:
            refuse(event)
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and not inside(path) and path not in ("/dev/null", b"/dev/null"):
                refuse(f"writing {path!r} (outside the scratch directory)")
            if read_blocked(path):
                refuse(f"reading {path!r}")
        elif event in ("os.listdir", "os.scandir") and args and args[0] is not None and read_blocked(args[0]):
            refuse(f"listing {args[0]!r}")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    refuse(f"{event} on {args[i]!r} (outside the scratch directory)")
        elif event == "import" and args and args[0] in _FORBIDDEN_IMPORTS:
            refuse(f"importing {args[0]}")

    return hook


def _classify(exc, violations):
    if isinstance(exc, SandboxViolation):
        return "forbidden"
    if isinstance(exc, MemoryError):
        return "memory"
    return "exception"


def main():
    job_path = sys.argv[1]
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    # Opened now: once the hook is in place nothing outside the scratch directory can be opened.
    result_file = open(job["result_path"], "w", encoding="utf-8")
    isolation, violations = [], []
    if job.get("netns", True):
        _try_netns(isolation)
    _prctl(isolation)
    os.chdir(job["scratch"])
    _rlimits(job, isolation)
    _socket_guard(violations, isolation)
    _process_guard(violations)
    isolation.append("process_guard")
    # Forget ctypes: a fresh import of it is refused by the hook, so native calls stay out of reach.
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
        del sys.modules[name]

    import linecache
    import traceback

    code = job["code"]
    linecache.cache["<sandbox>"] = (len(code), None, code.splitlines(True), "<sandbox>")
    result = {"ok": False, "value": None, "error_kind": None, "error": None}
    start = time.perf_counter()
    sys.addaudithook(_make_hook(job["scratch"], violations))
    isolation.append("audit_hook")
    try:
        namespace = {"__name__": "__sandbox__", "__builtins__": __builtins__}
        exec(compile(code, "<sandbox>", "exec"), namespace)
        value = None
        if job.get("entry"):
            fn = namespace.get(job["entry"])
            if not callable(fn):
                raise NameError(f"entry point {job['entry']!r} is not defined")
            args = job.get("args")
            if job.get("args_mode") == "positional":
                value = fn(*args)
            elif job.get("args_mode") == "keyword":
                value = fn(**args)
            else:
                value = fn()
        try:
            result["value"] = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"the result is not JSON-serializable: {exc}") from None
        result["ok"] = True
    except SystemExit as exc:
        if exc.code in (None, 0) and not job.get("entry"):
            result["ok"] = True
        else:
            result.update(error_kind="exception", error=f"SystemExit({exc.code!r})")
    except BaseException as exc:  # noqa: BLE001 - everything the code raises is reported, not propagated
        result["error_kind"] = _classify(exc, violations)
        try:
            # Show the user's frames only, not the runner's or the hook's.
            frames = [fr for fr in traceback.extract_tb(exc.__traceback__) if fr.filename != __file__]
            text = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc))
            result["error"] = text[-4000:]
        except BaseException:  # formatting itself may fail under the memory limit
            result["error"] = f"{type(exc).__name__}: {exc}"
    result["user_time_s"] = time.perf_counter() - start
    result["violations"] = violations[:20]
    result["isolation"] = isolation
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    result_file.write(json.dumps(result))
    result_file.close()
    # Skip interpreter shutdown: leftover non-daemon threads must not keep the process alive.
    os._exit(0)


if __name__ == "__main__":
    main()

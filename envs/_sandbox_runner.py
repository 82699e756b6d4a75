"""The child side of the sandbox: confine this interpreter, run the untrusted code, report a sealed result.

Run as `python -I -S -B _sandbox_runner.py RUN_ID` by envs.sandbox (under bubblewrap unless the
caller opted out), the job arriving as JSON on stdin; standard library only.

Two threads with different trust:
- the main thread reads the job, then does everything that needs privileges or native calls
  (rlimits, the seccomp filter, no-new-privileges, parent-death signal), installs the guards and
  the audit hook, then waits; at the end it encodes the result, seals it with HMAC-SHA256 under
  the per-run key and writes it to the inherited fd;
- a worker thread runs the untrusted code. It is started on a callable made of C objects only, so
  no frame of the runner lies under the untrusted code: `f_back` ends at `_run_untrusted`, whose
  frame holds nothing secret, and the outcome reaches the main thread through a queue that nothing
  the code can reach refers to.
The main thread stays out of reach: cross-thread introspection (`sys._current_frames`, `gc`
referrers/objects, tracing) is refused everywhere and frame access is refused on the main thread
(where finalizers or gc callbacks could run code). Everything the main thread and the audit hook
use once the code has started is bound beforehand, since the code can replace module globals
and builtins; the result encoder reads only exact built-in types, so no code of the untrusted
program runs while the result is written.
"""

import _queue
import _thread
import builtins
import functools
import gc
import hashlib
import itertools
import json
import linecache
import operator
import os
import resource
import signal
import sys
import time
import traceback
from _json import encode_basestring_ascii

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# Events refused outright: new processes, signals to others, native code, sockets, links,
# introspection that reaches other threads' frames or arbitrary objects, tracing, more audit hooks.
_FORBIDDEN_EVENTS = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "os.startfile", "signal.pthread_kill",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function",
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    "os.link", "os.symlink",
    "sys._current_frames", "sys._current_exceptions", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "sys.settrace", "sys.setprofile", "sys.addaudithook", "resource.setrlimit", "resource.prlimit",
})
# Frame access (`sys._getframe`, these attributes) is refused on the main thread only.
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# Events whose path arguments (by position) must lie inside the scratch directory.
_PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.chmod": (0,),
    "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,),
    "shutil.copytree": (1,), "shutil.move": (1,), "shutil.chown": (0,), "shutil.make_archive": (0,),
    "os.chdir": (0,),
}
# Fresh imports refused after setup: re-importing these would undo the patches below; a
# subinterpreter would run without the audit hook; the test modules reach raw memory.
_FORBIDDEN_IMPORTS = frozenset({"_posixsubprocess", "_ctypes", "ctypes", "_socket", "socket",
                                "_xxsubinterpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi"})
# Readable besides the scratch directory and the read roots of the job.
_READABLE_FILES = ("/dev/null", "/dev/urandom")
_ERROR_KINDS = frozenset({"exception", "forbidden", "memory"})


class SandboxViolation(PermissionError):
    """Raised in place of a refused operation."""


def _load_job():
    """Read the job from stdin (a pipe from the parent), then point stdin at /dev/null: the per-run
    key exists only in this process's memory, never in a file or a readable pipe."""
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return json.loads(b"".join(chunks))


def _prctl(job, isolation):
    """Die with the parent, never gain privileges through exec, then load the seccomp filter
    (a BPF program compiled by the parent with libseccomp) for this thread and every later one."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # PR_SET_PDEATHSIG
            isolation.append("pdeathsig")
        if libc.prctl(38, 1, 0, 0, 0) == 0:  # PR_SET_NO_NEW_PRIVS
            isolation.append("no_new_privs")
        if job.get("seccomp"):
            program = bytes.fromhex(job["seccomp"])

            class SockFprog(ctypes.Structure):
                _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

            buffer = ctypes.create_string_buffer(program, len(program))
            fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
            if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
                isolation.append("seccomp")
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
    import subprocess  # pre-imported so user imports need no fresh load

    def refuse(*_a, **_k):
        violations.append("subprocess")
        raise SandboxViolation("starting processes is disabled in the sandbox")

    # subprocess keeps its own reference to the C entry point: replace both.
    _posixsubprocess.fork_exec = refuse
    subprocess._fork_exec = refuse


def _make_resolver(getcwd, lstat, readlink):
    """`resolve(path)`: the real absolute path, or None where it cannot be judged safely.

    Symlinks are followed like the kernel does (the untrusted code cannot create any: links are
    refused). A path-like object is not judged (converting it again could name another file), nor
    a relative path with `..` (another thread may change the working directory in between).
    """
    str_, bytes_, type_, decode = str, bytes, type, bytes.decode
    OSError_, ValueError_ = OSError, ValueError

    def resolve(path):
        kind = type_(path)
        if kind is bytes_:
            path = decode(path, "utf-8", "surrogateescape")
        elif kind is not str_:
            return None
        try:
            if not path.startswith("/"):
                if ".." in path.split("/"):
                    return None
                path = getcwd() + "/" + path
            pending = path.split("/")
            pending.reverse()
            parts, links = [], 0
            while pending:
                name = pending.pop()
                if name == "" or name == ".":
                    continue
                if name == "..":
                    if parts:
                        parts.pop()
                    continue
                here = "/" + "/".join(parts + [name])
                try:
                    mode = lstat(here).st_mode
                except OSError_:
                    mode = 0
                if mode & 0o170000 != 0o120000:
                    parts.append(name)
                    continue
                links += 1
                if links > 40:
                    return None
                target = readlink(here).split("/")
                if target[0] == "":
                    parts = []
                target.reverse()
                pending.extend(target)
            return "/" + "/".join(parts)
        except (OSError_, ValueError_):
            return None

    return resolve


def _make_hook(scratch, read_roots, violations, main_thread):
    """The audit hook. It runs after untrusted code could replace module globals and builtins, so
    everything it uses is bound here."""
    resolve = _make_resolver(os.getcwd, os.lstat, os.readlink)
    scratch = resolve(os.path.realpath(scratch))
    inside_roots = (scratch,)
    readable_roots = (scratch, *map(os.path.realpath, read_roots))
    readable_files, write_flags = _READABLE_FILES, _WRITE_FLAGS
    forbidden, frame_attributes, path_events = _FORBIDDEN_EVENTS, _FRAME_ATTRIBUTES, _PATH_EVENTS
    forbidden_imports, get_ident, stat = _FORBIDDEN_IMPORTS, _thread.get_ident, os.stat
    Violation, OSError_, int_, str_, type_, len_, repr_ = SandboxViolation, OSError, int, str, type, len, repr

    def under(real, roots):
        for root in roots:
            if real == root or real.startswith(root + "/"):
                return True
        return False

    def is_dir(real):
        try:
            return stat(real).st_mode & 0o170000 == 0o040000
        except OSError_:
            return False

    def refuse(what):
        violations.append(what)
        raise Violation(what + " is not allowed in the sandbox")

    def check_read(path, verb):
        if type_(path) is int_ or path is None:
            return  # an fd that passed the open check, or the working directory (always inside)
        real = resolve(path)
        if real is None:
            refuse(verb + " a path given as " + ("a relative path with '..'" if type_(path) is str_ else "an object"))
        if not (under(real, readable_roots) or real in readable_files):
            refuse(verb + " " + repr_(real) + " (outside the scratch directory and the standard library)")
        return real

    def hook(event, args):
        if event in forbidden:
            refuse(event)
        elif event == "open":
            path, mode, flags = args
            writing = (type_(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                type_(flags) is int_ and flags & write_flags)
            if writing and type_(path) is not int_:
                real = resolve(path)
                if real is None or not (under(real, inside_roots) or real == "/dev/null"):
                    refuse("writing " + repr_(real) + " (outside the scratch directory)")
                return
            real = check_read(path, "reading")
            # A directory fd outside the scratch directory would anchor `dir_fd=` calls there.
            if real is not None and not under(real, inside_roots) and is_dir(real):
                refuse("opening the directory " + repr_(real))
        elif event == "os.listdir" or event == "os.scandir":
            check_read(args[0] if len_(args) else None, "listing")
        elif event in path_events:
            for i in path_events[event]:
                if i < len_(args) and args[i] is not None and type_(args[i]) is not int_:
                    real = resolve(args[i])
                    if real is None or not under(real, inside_roots):
                        refuse(event + " on " + repr_(real) + " (outside the scratch directory)")
        elif event == "import" and args and args[0] in forbidden_imports:
            refuse("importing " + args[0])
        elif get_ident() == main_thread and (
                event == "sys._getframe" or (event == "object.__getattr__" and args[1] in frame_attributes)):
            refuse("frame access on the runner's thread")

    return hook


def _make_encoder():
    """`encode(value)` -> (JSON text, None) or (None, why not), without running any code the
    untrusted program defined or replaced: exact built-in types are read directly and their
    subclasses only through the built-in types' own methods (json.dumps would call overrides)."""
    quote = encode_basestring_ascii
    type_, issubclass_, id_, dict_, list_, tuple_, str_, int_, float_ = (
        type, issubclass, id, dict, list, tuple, str, int, float)
    dict_items, list_copy, tuple_iter, str_copy = dict.items, list.copy, tuple.__iter__, str.__str__
    int_repr, float_repr, type_name = int.__repr__, float.__repr__, type.__dict__["__name__"].__get__
    TypeError_, ValueError_, RecursionError_, MemoryError_ = TypeError, ValueError, RecursionError, MemoryError
    set_ = set
    floats = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

    def scalar(value, kind):
        if value is None:
            return "null"
        if value is True:
            return "true"
        if value is False:
            return "false"
        if issubclass_(kind, str_):
            return quote(str_copy(value))
        if issubclass_(kind, int_):
            return int_repr(value)
        if issubclass_(kind, float_):
            text = float_repr(value)
            return floats.get(text, text)
        return None

    def key_text(key):
        kind = type_(key)
        if issubclass_(kind, str_):
            return quote(str_copy(key))
        text = scalar(key, kind)
        if text is None:
            raise TypeError_("keys must be str, int, float, bool or None, not " + str_copy(type_name(kind)))
        return quote(text)

    def walk(value, active):
        kind = type_(value)
        text = scalar(value, kind)
        if text is not None:
            return text
        if not issubclass_(kind, (dict_, list_, tuple_)):
            raise TypeError_("an object of type " + str_copy(type_name(kind)))
        marker = id_(value)
        if marker in active:
            raise ValueError_("circular reference")
        active.add(marker)
        if issubclass_(kind, dict_):
            text = "{" + ",".join([key_text(k) + ":" + walk(v, active) for k, v in list_(dict_items(value))]) + "}"
        else:
            items = list_copy(value) if issubclass_(kind, list_) else list_(tuple_iter(value))
            text = "[" + ",".join([walk(v, active) for v in items]) + "]"
        active.discard(marker)
        return text

    def encode(value):
        try:
            return walk(value, set_()), None
        except (TypeError_, ValueError_) as exc:
            return None, "the result is not JSON-serializable: " + exc.args[0]
        except RecursionError_:
            return None, "the result is not JSON-serializable: nested too deeply"
        except MemoryError_:
            return None, "the result is too large to encode"

    return encode


def _make_sealer(key):
    """`seal(payload) -> hex HMAC-SHA256(key, payload)`, from bound C hash objects only."""
    sha256 = hashlib.sha256
    block = key + bytes(64 - len(key))
    inner_pad, outer_pad = bytes(b ^ 0x36 for b in block), bytes(b ^ 0x5C for b in block)

    def seal(payload):
        return sha256(outer_pad + sha256(inner_pad + payload).digest()).hexdigest()

    return seal


def _make_reporter(fd, key, size_limit, isolation, violations):
    """The main thread's last step: wait for the worker, then encode, seal and write the result, exit."""
    encode, seal = _make_encoder(), _make_sealer(key)
    write, exit_, perf_counter, Empty = os.write, os._exit, time.perf_counter, _queue.Empty
    gc_disable, gc_callbacks = gc.disable, gc.callbacks
    setrecursionlimit, recursion_limit = sys.setrecursionlimit, sys.getrecursionlimit()
    type_, tuple_, str_, len_, float_repr = type, tuple, str, len, float.__repr__
    quote, error_kinds = encode_basestring_ascii, _ERROR_KINDS

    def report(join, outcomes, start):
        join()
        elapsed = perf_counter() - start
        # No callback of the untrusted code may run on this thread from here on.
        gc_disable()
        gc_callbacks.clear()
        setrecursionlimit(recursion_limit)
        try:
            outcome = outcomes.get_nowait()
        except Empty:
            outcome = None
        ok, value_text, kind, error = False, "null", "crash", "the code ended without an outcome"
        if type_(outcome) is tuple_ and len_(outcome) == 4:
            status, value, kind_, error_ = outcome
            if type_(status) is str_ and status == "ok":
                value_text, why = encode(value)
                if value_text is None:
                    value_text, kind, error = "null", "exception", why
                else:
                    ok, kind, error = True, None, None
            elif type_(kind_) is str_ and kind_ in error_kinds:
                kind = kind_
                error = error_[-4000:] if type_(error_) is str_ else "the error could not be described"
        listed = [v for v in violations[:20] if type_(v) is str_]
        payload = ('{"ok":' + ("true" if ok else "false") + ',"value":' + value_text
                   + ',"error_kind":' + ("null" if kind is None else quote(kind))
                   + ',"error":' + ("null" if error is None else quote(error))
                   + ',"violations":[' + ",".join([quote(v) for v in listed]) + "]"
                   + ',"isolation":[' + ",".join([quote(v) for v in isolation]) + "]"
                   + ',"user_time_s":' + float_repr(elapsed) + "}").encode("ascii")
        if len_(payload) + 65 > size_limit:
            payload = b'{"ok":false,"value":null,"error_kind":"exception","error":"the result is too large",' \
                      b'"violations":[],"isolation":[],"user_time_s":0.0}'
        message = (seal(payload) + "\n").encode("ascii") + payload
        while message:
            message = message[write(fd, message):]
        # Skip interpreter shutdown: leftover threads must not keep the process alive or run more code.
        exit_(0)

    return report



def _classify(exc):
    if isinstance(exc, SandboxViolation):
        return "forbidden"
    if isinstance(exc, MemoryError):
        return "memory"
    return "exception"


def _describe(exc):
    """The traceback of the untrusted code's frames (not the runner's), formatted on the worker."""
    try:
        frames = traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__), lookup_lines=False)
        frames = [fr for fr in frames if fr.filename != __file__]
        text = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc))
        return text[-4000:]
    except BaseException:  # formatting itself may fail under the memory limit
        return f"{type(exc).__name__}: {exc}"


def _run_untrusted(task):
    """The bottom frame of the worker thread: run the code, call the entry point.

    Returns ("ok", value, None, None) or ("error", None, kind, text); nothing in this frame is secret.
    """
    code = task["code"]
    linecache.cache["<sandbox>"] = (len(code), None, code.splitlines(True), "<sandbox>")
    try:
        namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
        exec(compile(code, "<sandbox>", "exec"), namespace)
        if not task["entry"]:
            return "ok", None, None, None
        fn = namespace.get(task["entry"])
        if not callable(fn):
            raise NameError(f"entry point {task['entry']!r} is not defined")
        args = task["args"]
        if task["args_mode"] == "positional":
            return "ok", fn(*args), None, None
        if task["args_mode"] == "keyword":
            return "ok", fn(**args), None, None
        return "ok", fn(), None, None
    except SystemExit as exc:
        if exc.code in (None, 0) and not task["entry"]:
            return "ok", None, None, None
        return "error", None, "exception", f"SystemExit({exc.code!r})"
    except BaseException as exc:  # noqa: BLE001 - everything the code raises is reported, not propagated
        return "error", None, _classify(exc), _describe(exc)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass


def _start_worker(task, outcomes):
    """Start `_run_untrusted(task)` on a new thread, its outcome going to `outcomes`; return `join`.

    The thread's callable is built from C objects only (partial, chain, map, filter, starmap,
    methodcaller, the queue's bound `put`): there is no Python frame under `_run_untrusted` to walk up to, and no object
    reachable from the code refers to `outcomes`.
    """
    run = itertools.starmap(_run_untrusted, [(task,)])
    if hasattr(_thread, "start_joinable_thread"):  # Python 3.13+
        return _thread.start_joinable_thread(functools.partial(any, map(outcomes.put, run))).join
    # The worker takes the sentinel lock first; the interpreter releases it once the thread is gone.
    sentinel = filter(operator.methodcaller("acquire"), itertools.starmap(_thread._set_sentinel, [()]))
    steps = itertools.chain(map(outcomes.put, sentinel), map(outcomes.put, run))
    _thread.start_new_thread(functools.partial(any, steps), ())
    sentinel = outcomes.get()
    return sentinel.acquire


def main():
    job = _load_job()
    key = bytes.fromhex(job.pop("key"))
    isolation, violations = [], []
    os.chdir(job["scratch"])
    if job["site_dirs"]:
        import site

        for directory in job["site_dirs"]:
            site.addsitedir(directory)
    _rlimits(job, isolation)
    # Imported here, not first by the code on the worker thread: threading's import takes the
    # importing thread's exit sentinel for its main-thread object, and the runner waits on the worker's.
    import threading  # noqa: F401
    guards = job["guards"]  # off only when a test checks the OS walls alone
    if guards:
        _socket_guard(violations, isolation)
        _process_guard(violations)
        isolation.append("process_guard")
    _prctl(job, isolation)
    # Forget ctypes: a fresh import of it is refused by the hook, so native calls stay out of reach.
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
        del sys.modules[name]
    isolation += ["audit_hook", "worker_thread", "sealed_result"] if guards else ["worker_thread", "sealed_result"]
    report = _make_reporter(job["result_fd"], key, job["fsize_mb"] * 1024 * 1024, isolation, violations)
    del key
    task = {k: job[k] for k in ("code", "entry", "args", "args_mode")}
    outcomes = _queue.SimpleQueue()
    if guards:
        sys.addaudithook(_make_hook(job["scratch"], job["read_roots"], violations, _thread.get_ident()))
    start = time.perf_counter()
    report(_start_worker(task, outcomes), outcomes, start)


if __name__ == "__main__":
    main()

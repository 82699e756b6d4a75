"""The sandbox's seccomp filter, compiled to a BPF program with libseccomp (through pyseccomp).

The parent compiles it once; the sandbox runner loads the raw program into itself after its own
setup (rlimits, guards) and before any untrusted code runs, so every thread the code starts
inherits it. Allowed by default, refused with EPERM: whatever starts or reaches another process
(fork, exec, ptrace, signals), sockets, device and FIFO nodes, links, raising limits, and the
kernel interfaces an unprivileged program never needs (mounts, namespaces, keyrings, BPF,
io_uring, perf, module loading). `clone` is allowed only for threads; `clone3` answers ENOSYS so
the C library falls back to `clone`, whose flags the filter can read.
"""

from __future__ import annotations

import errno
import functools
import tempfile

# Refused outright (names unknown to this architecture are skipped).
DENIED = (
    "execve", "execveat", "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev",
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "socket", "socketpair", "mknod", "mknodat", "link", "linkat", "symlink", "symlinkat", "setrlimit",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree", "fsopen",
    "fsmount", "fsconfig", "fspick", "mount_setattr", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "personality", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "syslog", "acct", "quotactl", "name_to_handle_at", "open_by_handle_at", "iopl", "ioperm",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "fanotify_init", "vhangup",
)
CLONE_THREAD = 0x00010000


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its Python binding) is not installed."""


@functools.cache
def filter_program() -> bytes:
    """The compiled BPF program (raw `struct sock_filter` array) for this machine's architecture."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, AttributeError, TypeError) as exc:  # the binding loads libseccomp on import
        raise SeccompUnavailable(f"libseccomp is not available ({exc})") from None
    flt = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            flt.add_rule(deny, name)
        except (OSError, ValueError):
            continue  # not a system call on this architecture
    # Threads only: a clone without CLONE_THREAD would be a new process.
    flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # Reading limits stays allowed (prlimit64 with no new value); setting them does not.
    flt.add_rule(deny, "prlimit64", sc.Arg(2, sc.NE, 0))
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        program = fh.read()
    if not program or len(program) % 8:
        raise SeccompUnavailable("libseccomp exported no filter program")
    return program


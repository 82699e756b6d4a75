"""The Beam SDK worker that `trajforge convert` starts for its local worker processes.

It is Beam's own worker (`apache_beam.runners.worker.sdk_worker_main`), plus a watch on the
driver that started it: when the driver is killed, the worker exits within ~0.1 s instead of
lingering until the runner's connection times out (seconds), and a killed convert leaves no
process behind. Usage (what `pipelines.convert` runs): `python -m pipelines.convert_worker PID START`,
the driver's pid and start time (`convert_work.driver_identity`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

_watching = threading.Lock()


def process_identity(pid: int) -> tuple[int, str] | None:
    """(pid, start time) of a live process, or None when it is gone or a zombie (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the ")" of the command name: state is field 3 of stat(5), ppid 4, start time 22.
    return None if fields[0] == b"Z" else (int(fields[1]), fields[19].decode())


def _is_ancestor(pid: int, levels: int = 3) -> bool:
    current = os.getpid()
    for _ in range(levels):
        identity = process_identity(current)
        if identity is None:
            return False
        current = identity[0]
        if current == pid:
            return True
    return False


def exit_with_driver(driver: tuple[int, str] | None, interval: float = 0.1) -> None:
    """In a worker process the driver started (Beam's local runner runs each worker under
    `sh -c`): exit as soon as the driver is gone (killed). `driver` is `(pid, start time)` taken
    in the driver, so a reused pid is not mistaken for it. Anywhere else it does nothing."""
    if driver is None or os.getpid() == driver[0] or not _is_ancestor(driver[0]):
        return
    if not _watching.acquire(blocking=False):
        return
    pid, started = driver

    def watch() -> None:
        while (identity := process_identity(pid)) is not None and identity[1] == started:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-driver", daemon=True).start()


def driver_identity() -> tuple[int, str] | None:
    """This process as `exit_with_driver` recognizes it (None where /proc is missing)."""
    identity = process_identity(os.getpid())
    return None if identity is None else (os.getpid(), identity[1])


def main(argv: list[str]) -> None:
    exit_with_driver((int(argv[1]), argv[2]))
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main(argv[:1])
    # The harness is done and has said so; skip the interpreter's teardown (joining gRPC's
    # threads, freeing every module: ~0.3 s per worker, and the runner waits for its workers
    # one after another).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)

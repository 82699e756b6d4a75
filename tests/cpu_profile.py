"""CPU seconds per test, for deciding what the suite spends (`-p tests.cpu_profile`, output in $CPU_PROFILE).

Each test's line holds the user+system seconds of its worker process and of the children it reaped during the test
(servers, browsers and CLI runs it started and waited for); wall seconds beside them. Load-independent enough to
compare runs on a busy machine, unlike wall time.

    CPU_PROFILE=/tmp/cpu.jsonl python -m pytest -p tests.cpu_profile -n 3 --dist loadfile
    python -m tests.cpu_profile /tmp/cpu.jsonl        # per file, the largest first
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from typing import Any

import pytest


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Any:
    path = os.environ.get("CPU_PROFILE")
    cpu, wall = _cpu(), time.perf_counter()
    yield
    if path:
        line = {"test": item.nodeid, "cpu_s": round(_cpu() - cpu, 2), "wall_s": round(time.perf_counter() - wall, 2)}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def summary(path: str, top: int = 40) -> None:
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    total = 0.0
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        f = files[row["test"].split("::")[0]]
        f[0] += row["cpu_s"]
        f[1] += row["wall_s"]
        f[2] += 1
        total += row["cpu_s"]
    print(f"{total:.0f} CPU s in {sum(f[2] for f in files.values())} tests")
    for name, (cpu, wall, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:7.1f} cpu {wall:7.1f} wall {n:4d}  {name}")


if __name__ == "__main__":
    summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)

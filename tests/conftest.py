"""Test-session setup: offline libraries, scratch homes, the shared sample data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Real ADP sample records ship in the repository (provenance: samples/README.md).
ADP_DIR = REPO / "samples" / "adp"

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# rich fixes a console's width for good when COLUMNS is set as the console is made: made now, without
# it, the CLI's consoles follow the COLUMNS each test gives (whichever test imports them first).
os.environ.pop("COLUMNS", None)
import flows.console  # noqa: E402,F401


@pytest.fixture(scope="session")
def adp_dir() -> Path:
    return ADP_DIR


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-full", action="store_true", default=False,
        help="run the full reliability suite (10 kill points per job, >= 10k fuzz cases) instead of its fast subset",
    )


# The files that take longest, longest first (CPU seconds on 2 cores, measured 2026-11-27; the first five and the
# improve report's re-measured one file at a time 2026-11-29, wall (CPU) seconds: improve 110 (77), train_gguf
# 64 (46), browser_miniwob 61 (31), requests_in_exports 47 (42), browser 38 (18), improve_rounds_report 9 (6)).
# `make test` hands whole files to its workers in collection order (`--dist loadfile`), so these start first and the
# rest fill in around them: the workers finish together instead of one running a long file alone at the
# end. A file not listed keeps its place after them.
HEAVY_FILES = (
    "flows/test_improve.py", "training/test_train_gguf.py", "envs/test_browser_miniwob.py",
    "generators/test_requests_in_exports.py", "envs/test_browser.py",
    "flows/test_pipeline_flow.py", "flows/test_work_pool.py", "reliability/test_crash_resume.py",
    "pipelines/test_portable.py", "reliability/test_data_safety.py",
    "export/test_loss_share.py", "flows/test_pipeline_decontam.py", "flows/test_agent_r.py",
    "viewer/test_viewer_browser.py", "viewer/test_viewer_reports.py", "reliability/test_secret_stages.py",
    "pipelines/test_convert_pipeline.py",
    "generators/test_shipped_configs.py", "cli/test_own_servers.py", "training/test_train.py",
    "training/test_grpo.py", "envs/test_tau2_domains.py", "envs/test_mcp_content.py", "training/test_verifiers.py",
    "flows/test_improve_rounds_report.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FILES)}

    def key(item: pytest.Item) -> int:
        path = Path(str(item.path)).relative_to(REPO / "tests").as_posix() if str(item.path).startswith(str(REPO)) else ""
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: each file's own order is kept

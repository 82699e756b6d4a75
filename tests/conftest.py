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


# The files that take longest, longest first: wall seconds of each file in a full `make test` run (3 workers on
# 2 cores, 2026-11-29; the top five: improve 142, requests_in_exports 94, crash_resume 92, browser_miniwob 82,
# portable 82; every file listed took 12 s or more).
# `make test` hands whole files to its workers in collection order (`--dist loadfile`), so these start first and the
# rest fill in around them: the workers finish together instead of one running a long file alone at the
# end. A file not listed keeps its place after them.
HEAVY_FILES = (
    "flows/test_improve.py", "generators/test_requests_in_exports.py", "reliability/test_crash_resume.py",
    "envs/test_browser_miniwob.py", "pipelines/test_portable.py", "flows/test_pipeline_flow.py",
    "flows/test_work_pool.py", "training/test_verifiers.py", "envs/test_browser.py",
    "pipelines/test_convert_pipeline.py", "cli/test_own_servers.py", "flows/test_agent_r.py",
    "generators/test_ui_simulator_pages.py", "training/test_train.py", "training/test_train_gguf.py",
    "generators/test_shipped_configs.py", "export/test_loss_share.py", "export/test_export_run.py",
    "generators/test_browser_methods.py", "export/test_token_truth.py", "export/test_trl_trainers.py",
    "export/test_trl_search_exports.py", "cli/test_envs_command.py", "backends/test_llamacpp.py",
    "generators/test_simia_sft.py", "flows/test_improve_rounds_report.py", "envs/test_mcp.py",
    "filters/test_user_fidelity.py", "backends/test_scoring.py", "training/test_grpo.py",
    "generators/test_step_verify.py", "schemas/test_store.py", "envs/test_tau2_domains.py",
    "backends/test_endpoints.py", "viewer/test_viewer_browser.py", "converters/test_cli_samples.py",
    "converters/test_atif.py", "envs/test_sandbox.py", "training/test_trl_env.py", "training/test_openenv.py",
    "backends/test_engine_crash.py", "cli/test_tau2_own_setup.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FILES)}

    def key(item: pytest.Item) -> int:
        path = Path(str(item.path)).relative_to(REPO / "tests").as_posix() if str(item.path).startswith(str(REPO)) else ""
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: each file's own order is kept

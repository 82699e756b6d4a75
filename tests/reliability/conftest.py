"""Reliability suite setup: fast or full size, a Prefect server for flow runs.

`make test` runs the fast subset; `pytest --reliability-full` runs every test at full size
(10 kill points per job, >= 10k fuzz cases). Sizes differ, seeds do not: a failure of the
full run reproduces with the same command.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Prefect reads these when it is imported: set them first (kept if another conftest set them).
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="trajforge-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture(scope="session")
def full(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--reliability-full"))


@pytest.fixture(scope="session")
def size(full: bool):
    """size(fast, full_n) -> the number for this run."""
    return lambda fast, full_n: full_n if full else fast


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """The API URL of a Prefect test server: the session's running one, else a new one."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    if PREFECT_API_URL.value():  # tests/flows started one for this session
        yield PREFECT_API_URL.value()
        return
    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()

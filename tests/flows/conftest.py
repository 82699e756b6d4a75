"""One Prefect test server per test session (it takes ~15 s to start), in a scratch PREFECT_HOME."""

from __future__ import annotations

import os
import tempfile

import pytest

# Prefect reads these when it is imported: set them first.
_HOME = tempfile.mkdtemp(prefix="trajforge-prefect-")
os.environ["PREFECT_HOME"] = _HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# Scheduled runs (trajforge serve --interval) appear within seconds, not the default minute.
os.environ.setdefault("PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED", "true")
os.environ.setdefault("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "2")


@pytest.fixture(scope="session")
def prefect_harness():
    """A running Prefect test server; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()

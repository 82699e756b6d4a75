"""Exporter test setup: the `trl` marker and small stored datasets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.export import _data


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "trl: runs real TRL trainers on CPU (needs `trl`, from the train extra)")


@pytest.fixture()
def hand_dataset(tmp_path: Path) -> Path:
    pair, chosen, rejected = _data.branch_pair()
    trajectories = [_data.tool_traj(), _data.masked_traj(), _data.interleaved_traj(), _data.labeled_traj(),
                    _data.no_assistant_traj(), chosen, rejected]
    return _data.store(tmp_path / "hand", trajectories, [pair])


@pytest.fixture(scope="session")
def adp_dataset(tmp_path_factory: pytest.TempPathFactory, adp_dir: Path) -> Path:
    return _data.store(tmp_path_factory.mktemp("adp") / "ds", _data.adp_trajectories(adp_dir), max_rows=20)

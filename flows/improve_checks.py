"""What `trajforge improve` checks before anything runs (no Prefect import: the CLI checks before a server starts).

- the output is new, empty, or an earlier improve run's (`_state/`): never a user's directory or a dataset;
- the base exists;
- no generation task (any round, the warm start) is a test task;
- no method that reads reference solutions (demonstrations: an oracle) runs on a measured task group (a
  MiniWoB page over its seeds, a tau2 task): a warm start teaches other tasks, so a gain on the measured ones
  is the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.improve_config import ImproveConfig

STATE_DIR = "_state"
# What an improve run writes before its first stage state: Prefect's home and the flow's lock.
_EARLY = {"_prefect", "_pipeline.lock", STATE_DIR}


class ImproveError(ValueError):
    """The loop cannot run as configured; the message is one line."""


@dataclass
class TaskPlan:
    train: int
    test: int
    split: str
    reference_tasks: list[str] = field(default_factory=list)  # tasks any method gave a reference solution of
    measured_overlap: int = 0  # of those, tasks in a measured group (refused with rounds; one round allows it)

    def warm_start(self) -> dict[str, Any]:
        return {"tasks": self.reference_tasks, "measured_overlap": self.measured_overlap}


def check_output(root: Path) -> None:
    """Refuse a file, or a non-empty directory that no improve run wrote (no `_state/`)."""
    if root.exists() and not root.is_dir():
        raise ImproveError(f"{root}: exists and is not a directory; choose a new or empty directory for the output")
    if not root.is_dir():
        return
    entries = sorted(p.name for p in root.iterdir())
    if entries and STATE_DIR not in entries and not set(entries) <= _EARLY:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise ImproveError(f"{root}: not empty ({shown}) and not an improve output (no {STATE_DIR}/); refusing to "
                           "write into it: choose a new or empty directory")


def base_source(cfg: ImproveConfig) -> str:
    if cfg.base:
        return cfg.base
    if cfg.llm.model_path:
        return cfg.llm.model_path
    from backends.transformers_backend import default_model_path

    return default_model_path()


def check_base(cfg: ImproveConfig) -> Path:
    source = Path(base_source(cfg))
    if not source.exists():
        raise ImproveError(f"base {source}: no such file or directory")
    return source


def _shown(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")


def check_tasks(cfg: ImproveConfig) -> TaskPlan:
    """The generation tasks of every round against the test tasks; ImproveError on any overlap."""
    from envs.spec import EnvFactory, EnvSpec
    from evals.report import task_group
    from evals.run import with_split
    from generators.registry import get_method
    from generators.runner import load_config

    _, split, test = with_split(cfg.eval_config(), cfg.eval.split)
    test_ids = {t.id for t in test}
    measured = {task_group(t) for t in test_ids}
    train: set[str] = set()
    reference: set[str] = set()
    for k in range(cfg.first_round(), cfg.rounds + 1):
        for entry in cfg.generate_entries(k):
            gen = load_config({key: v for key, v in entry.items() if key != "name"})
            method = get_method(gen.method)
            if not (isinstance(gen, EnvSpec) and getattr(method, "uses_task_source", False)):
                continue
            ids = {t.id for t in EnvFactory(gen).tasks()}
            train |= ids
            if getattr(method, "uses_reference_solutions", False):
                reference |= ids
    shared = sorted(test_ids & train)
    if shared:
        raise ImproveError(f"the generation tasks include {len(shared)} of the {len(test_ids)} test tasks "
                           f"({_shown(shared)}): give the task source a test split "
                           "(tau2's split file; MiniWoB's seeds from 100000) or generate.tasks of their own")
    oracle = sorted(t for t in reference if task_group(t) in measured)
    if cfg.in_rounds and oracle:
        raise ImproveError(f"reference solutions (demonstrations) on {len(oracle)} task(s) of the measured "
                           f"groups ({_shown(oracle)}): a warm start may only use tasks other than the measured "
                           "ones; give warm_start.tasks pages/tasks the evals do not run")
    return TaskPlan(train=len(train), test=len(test_ids), split=split, reference_tasks=sorted(reference),
                    measured_overlap=len(oracle))


def preflight(cfg: ImproveConfig) -> TaskPlan:
    """Every check, in the order a user fixes them."""
    check_output(cfg.root)
    check_base(cfg)
    return check_tasks(cfg)

"""Run one generation method from its config into a dataset directory (no Prefect needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from backends.registry import make_llm
from generators.base import GenerationMethod, MethodConfig, RunSummary, TaskSpec, llm_config_for, role_fields
from generators.registry import get_method
from schemas.store import Dataset


def load_config(data: dict[str, Any], method: str | None = None) -> MethodConfig:
    """Validate a method config dict (from YAML); `method` fills or checks its `method` key."""
    data = dict(data)
    if method is not None:
        if data.get("method") not in (None, method):
            raise ValueError(f"config is for method {data['method']!r}, not {method!r}")
        data["method"] = method
    if "method" not in data:
        raise ValueError("config names no method")
    return get_method(data["method"]).Config.model_validate(data)


async def generate(
    config: MethodConfig,
    output: str | Path,
    *,
    overwrite: bool = False,
    progress: Any = None,
    tasks: Iterable[TaskSpec] | None = None,
    method_cls: type[GenerationMethod] | None = None,
) -> RunSummary:
    """Run `config`'s method (or `method_cls`, one not registered) into `output`; resumes a half-finished run
    of the same config."""
    output = Path(output)
    ds = Dataset.create(output, stage=f"generate:{config.method}", config_hash=config.output_hash(), overwrite=overwrite)
    ds.recover()
    llm = make_llm(llm_config_for(config, output))
    # Each role model the config sets (judge, teacher, student, ...): its own client, cache and ledger.
    roles = {name: make_llm(llm_config_for(config, output, name)) for name in role_fields(config)}
    method = (method_cls or get_method(config.method))(config, llm)
    method.field_models.update(roles)
    try:
        summary = await method.run(method.tasks() if tasks is None else tasks, ds, progress=progress)
        for name, role_llm in roles.items():
            summary.llm[name] = role_llm.stats.as_dict()
    finally:
        await llm.aclose()
        for role_llm in roles.values():
            await role_llm.aclose()
    ds.mark_complete(
        {
            **dict(ds.unit_counts()),
            "tasks_total": summary.tasks,
            "llm_calls": summary.llm.get("calls", 0),
            "llm_cache_hits": summary.llm.get("cache_hits", 0),
        }
    )
    # The last run's summary as JSON (what `trajforge generate` printed), beside the counts.
    ds.update_manifest(last_run=summary.as_dict())
    return summary

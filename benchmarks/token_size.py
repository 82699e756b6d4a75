"""What token truth costs on disk: Parquet bytes per 1,000 model steps with and without `usage.tokens`.

The same retail rollouts are generated twice against the fake OpenAI-compatible server (scripted answers: the
reference actions, then a closing message), once with `llm.token_ids: on`, once `off`, and the trajectory shards
are compared. The fake server's tokens are words and whitespace runs (ids spread over a 49k vocabulary), about
as many per prompt as a BPE tokenizer makes of English text; each model step stores its whole prompt.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from backends.fake_server import FakeServer, Rule, ToolCallAnswer
from benchmarks._common import main_over_records, row
from envs.registry import make_env
from generators.runner import generate, load_config
from schemas.store import Dataset

DONE = "All done: your request is complete. Is there anything else I can help with?"


def _script(tasks: list[Any]) -> Any:
    plans = {t.instruction: [ToolCallAnswer(a["function"], a["arguments"]) for a in t.goal["actions"]] + [DONE]
             for t in tasks}

    def answer(body: dict[str, Any]) -> Any:
        if not body.get("tools"):
            return None
        task = next(m["content"] for m in body["messages"] if m["role"] == "user")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        plan = plans[task]
        return plan[turn] if turn < len(plan) else DONE
    return answer


def _size(records: int, out: Path, base_url: str, token_ids: str) -> tuple[int, int, int, int]:
    """(Parquet bytes of the trajectory shards, model steps, steps, recorded token ids)."""
    config = {"method": "rollout", "env": "retail", "env_config": {"seed": 0}, "tasks": {"n": records},
              "max_steps": 12, "concurrency": 8, "unit_tasks": 100,
              "llm": {"backend": "openai", "base_url": base_url, "model": "fake-model", "api_key_env": None,
                      "max_retries": 0, "token_ids": token_ids}}
    asyncio.run(generate(load_config(config), out))
    ds = Dataset.open(out)
    size = sum(f.stat().st_size for f in ds.shard_files("trajectories"))
    trajectories = list(ds.iter_records())
    calls = [s.usage for t in trajectories for s in t.steps if s.usage is not None]
    ids = sum(len(u.tokens.prompt_ids) + len(u.tokens.completion_ids) for u in calls if u.tokens is not None)
    return size, len(calls), sum(len(t.steps) for t in trajectories), ids


def run(records: int, workdir: Path) -> list[dict[str, Any]]:
    tasks = make_env("retail", seed=0).generate_tasks(records, seed=0)
    with FakeServer(rules=[Rule(fn=_script(tasks))], keep_log=False) as server:
        with_ids, model, steps, ids = _size(records, workdir / "on", server.base_url, "on")
        without, model_off, _, _ = _size(records, workdir / "off", server.base_url, "off")
    assert model == model_off, "both runs must hold the same model steps"
    per_with, per_without = with_ids / model * 1000, without / model * 1000
    print(f"{records} trajectories, {steps} steps ({model} by the model): {with_ids / 2**20:.2f} MiB with token ids, "
          f"{without / 2**20:.2f} MiB without; per 1,000 model steps {per_with / 2**20:.2f} MiB vs "
          f"{per_without / 2**20:.2f} MiB (+{(per_with - per_without) / 2**20:.2f} MiB)")
    return [
        row("Parquet bytes per 1,000 model steps with token ids", per_with / 2**20, "MiB",
            reference=per_without / 2**20, reference_name="without token ids"),
        row("model steps per trajectory", model / records, "steps"),
        row("token ids per model step (prompt + completion)", ids / model, "ids"),
    ]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    return main_over_records("token_size", "token truth size", run, argv, __doc__.splitlines()[0],
                             default_records=1000)


if __name__ == "__main__":
    main()

"""A trajforge world as TRL's `environment_factory`: one step of TRL's own GRPOTrainer on a tiny model, on a MiniWoB
page in Chromium. TRL renders the world's tools from the class's methods, runs its own tool-calling loop against
them and takes the reward from `get_reward` (the page's own); every rollout is a trajforge trajectory. The tiny
random model cannot write a tool call, so its `generate` is scripted (per prompt: click the asked button, or give
up); everything else is TRL's."""

from __future__ import annotations

import re

import pytest

from schemas.store import Dataset
from tests.export import _tiny
from training.trl_env import TrajforgeEnvironments, python_type, tool_method

pytestmark = pytest.mark.trl

CONFIG = {"env": "browser", "env_config": {"observe": ["axtree"], "actions": ["click"]},
          "tasks": {"source": "miniwob", "options": {"tasks": ["click-button"], "seeds": 1}}, "max_steps": 2}


def scripted_generate(tokenizer, answers):
    """A `generate` that answers each prompt (left-padded ids) with the next of `answers(prompt_text)`."""
    import torch

    def generate(input_ids, attention_mask=None, **_):
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = tokenizer.decode([i for i, m in zip(ids, mask) if m])
            rows.append(tokenizer(answers(prompt))["input_ids"] + [tokenizer.eos_token_id])
        width = max(map(len, rows))
        padded = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]
        return torch.cat([input_ids, torch.tensor(padded, dtype=input_ids.dtype)], dim=1)

    return generate


def test_grpo_trains_a_step_with_the_world_as_its_environment_factory(tmp_path):
    import trl

    model_dir = _tiny.model_dir(tmp_path / "model", _tiny.AGENT_CORPUS, template_name="qwen2_5")
    tokenizer = _tiny.load_tokenizer(model_dir)
    envs = TrajforgeEnvironments(CONFIG, output=tmp_path / "episodes")
    try:
        turns = {"first": 0}

        def answers(prompt: str) -> str:
            if "<tool_response>" in prompt:  # after the page answered the click
                return "Done."
            turns["first"] += 1
            if turns["first"] % 2 == 0:
                return "I cannot do that."
            label = re.search(r'Click on the "([^"]+)" button', prompt).group(1)
            bid = re.search(r"\[(\w+)\] button '" + re.escape(label) + "'", prompt).group(1)
            return f'<tool_call>\n{{"name": "click", "arguments": {{"bid": "{bid}"}}}}\n</tool_call>'

        args = trl.GRPOConfig(output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=2,
                              max_steps=1, max_completion_length=256, learning_rate=1e-3, report_to=[], use_cpu=True,
                              save_strategy="no", logging_steps=1, dataloader_num_workers=0, beta=0.0, seed=0,
                              gradient_checkpointing=False)
        trainer = trl.GRPOTrainer(model=str(model_dir), args=args, processing_class=tokenizer,
                                  train_dataset=envs.dataset(repeat=2), environment_factory=envs)
        trainer.model.generate = scripted_generate(trainer.processing_class, answers)
        trainer.train()
    finally:
        counts = envs.close()
    assert trainer.state.global_step == 1
    [logged] = [e for e in trainer.state.log_history if "reward" in e]
    # The group: one rollout clicked the asked button (the page's reward 1), one gave up (0).
    assert logged["reward"] == pytest.approx(0.5) and logged["tools/call_frequency"] == pytest.approx(0.5)
    records = sorted(Dataset.open(tmp_path / "episodes").iter_records(), key=lambda r: r.reward)
    assert counts["trajectories"] == 2 and [r.reward for r in records] == [0.0, 1.0]
    gave_up, clicked = records
    assert [s.kind for s in clicked.steps][:4] == ["text", "text", "web", "api"] and clicked.steps[3].function == "click"
    assert clicked.details["stop_reason"] == "done" and gave_up.details["stop_reason"] == "ended"
    assert clicked.details["driver"]["kind"] == "trl" and clicked.details["render"] is None
    assert {r.id for r in records} == {"rollout/miniwob/click-button/0#0", "rollout/miniwob/click-button/0#1"}


def test_tools_become_methods_trl_can_read():
    from transformers.utils import get_json_schema

    from schemas.models import Tool

    schema = {"type": "object", "required": ["order_id", "items"], "properties": {
        "order_id": {"type": "string", "description": "The order,\n  with its '#'."},
        "items": {"type": "array", "items": {"type": "string"}},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "note": {"type": ["string", "null"]}, "address": {"type": "object", "properties": {"zip": {"type": "string"}}}}}
    method = tool_method(Tool(name="get-order", description="Look an order up.", parameters=schema))
    got = get_json_schema(method)
    assert got["function"]["name"] == "get-order" and got["function"]["description"] == "Look an order up."
    params = got["function"]["parameters"]
    assert params["required"] == ["order_id", "items"]
    assert params["properties"]["order_id"] == {"type": "string", "description": "The order, with its '#'."}
    assert params["properties"]["items"]["items"] == {"type": "string"}
    assert params["properties"]["mode"]["enum"] == ["fast", "slow"]
    assert params["properties"]["address"]["type"] == "object"  # a nested object: its properties are not shown
    assert python_type({"type": "integer"}) is int
    with pytest.raises(ValueError, match="TRL reserves that name"):
        tool_method(Tool(name="reset", description="", parameters={}))
    with pytest.raises(ValueError, match="cannot be a Python parameter"):
        tool_method(Tool(name="t", description="", parameters={"properties": {"class": {"type": "string"}}}))

"""`trajforge train --objective grpo --config ENV_CONFIG` with a tiny random model on a MiniWoB page (Chromium):
two GRPO steps of a group of four, every rollout an episode of the one loop written as a trajectory, rewards the
page's own."""

from __future__ import annotations

import dataclasses
import json

import yaml
from typer.testing import CliRunner

from envs.browser import env as browser_env
from envs.browser import miniwob
from flows.cli import app
from schemas.store import Dataset
from tests.cli_errors import one_error_line
from tests.export import _tiny


def _env_config(path, model, temperature=1.0):
    path.write_text(yaml.safe_dump({
        "env": "browser", "env_config": {"observe": ["axtree"], "actions": ["click"]},
        "tasks": {"source": "miniwob", "options": {"tasks": ["click-button"], "seeds": 1}},
        "max_steps": 1, "max_parse_failures": 1,
        "llm": {"backend": "transformers", "model_path": str(model), "max_tokens": 4, "temperature": temperature,
                "max_retries": 0}}))
    return path


def test_grpo_trains_two_steps_on_a_miniwob_page_with_its_rollouts_as_trajectories(tmp_path_factory, tmp_path,
                                                                                   monkeypatch):
    model = _tiny.shared_model_dir(tmp_path_factory)
    # The random model never clicks the button, so the page's reward is always 0. To see that the
    # reward GRPO trains on is the page evaluation's and nothing else, each real evaluation of the page
    # is kept (its state, reason, raw reward) with its reward raised by an eighth per episode so far.
    evaluations, evaluate = [], miniwob.evaluation

    def page_evaluation(state):
        real = evaluate(state)
        evaluations.append(dataclasses.replace(real, reward=real.reward + 0.125 * len(evaluations)))
        return evaluations[-1]

    monkeypatch.setattr(browser_env.miniwob, "evaluation", page_evaluation)
    config = _env_config(tmp_path / "env.yaml", model, temperature=0.7)
    out = tmp_path / "grpo"
    run = CliRunner().invoke(app, ["train", "--objective", "grpo", "--config", str(config), "--base", str(model),
                                   "--output", str(out), "--max-steps", "2", "--batch-size", "4", "--generations", "4",
                                   "--no-gradient-checkpointing", "--device", "cpu"])
    assert run.exit_code == 0, run.output
    card = json.loads((out / "train.json").read_text())
    assert card["objective"] == "grpo" and card["steps"] == 2 and (out / "config.json").is_file()
    # TRL's groups are the --generations, scored at the temperature that sampled them.
    assert card["grpo"]["num_generations"] == 4 and card["grpo"]["temperature"] == 0.7
    assert card["settings"]["gradient_checkpointing"] is False
    # 2 steps x 4 generations of the one page, each a trajectory on disk with the page's evaluation.
    records = list(Dataset.open(out / "rollouts").iter_records())
    assert len(records) == 8 and {r.provenance.task_id for r in records} == {"miniwob/click-button/0"}
    assert sorted(r.id for r in records) == [f"rollout/miniwob/click-button/0#{k}" for k in range(8)]
    for r in records:
        # The page's own evaluation (MiniWoB's raw reward), as for any rollout of the browser world.
        assert r.details["evaluation"]["reward"] == r.reward and "raw_reward" in r.details["evaluation"]["details"]
        calls = [s.usage.tokens for s in r.steps if s.usage is not None and s.usage.tokens is not None]
        assert calls and calls[0].logprobs  # the live model's own tokens and logprobs, as recorded by the backend
    # One page evaluation per rollout; TRL's reward for each step is the mean of that step's page evaluations.
    assert len(evaluations) == 8 and sorted(r.reward for r in records) == [0.125 * k for k in range(8)]
    assert card["rewards"] == [0.1875, 0.6875]
    # Each step's group of four had four different rewards: no group without an advantage.
    assert [(e["step"], e["frac_reward_zero_std"]) for e in card["step_log"]] == [(1, 0.0), (2, 0.0)]
    assert all(e["reward_std"] > 0 for e in card["step_log"])


def test_grpo_needs_a_config_and_no_export(tmp_path):
    run = CliRunner().invoke(app, ["train", "--objective", "grpo", "--base", "x", "--output", str(tmp_path / "o")])
    one_error_line(run, "--objective grpo with --config")
    run = CliRunner().invoke(app, ["train", str(tmp_path), "--generations", "4", "--base", "x",
                                   "--output", str(tmp_path / "o")])
    one_error_line(run, "--generations is for --objective grpo")


def test_a_multi_turn_episode_is_one_completion_with_the_environments_tokens_masked():
    from schemas.models import TextObservation, Tokens, Trajectory, Usage
    from training.grpo import completion_tokens

    def call(prompt, completion):
        return TextObservation(content="x", source="agent", usage=Usage(tokens=Tokens(
            prompt_ids=prompt, completion_ids=completion, logprobs=[-0.5] * len(completion))))

    steps = [call([1, 2], [3, 4]), call([1, 2, 3, 4, 9, 9], [5]), call([7, 7], [8])]  # the last: a cut history
    trajectory = Trajectory.model_construct(steps=steps)
    assert completion_tokens(trajectory) == ([1, 2], [3, 4, 9, 9, 5], [-0.5, -0.5, 0.0, 0.0, -0.5], [1, 1, 0, 0, 1])
    assert completion_tokens(Trajectory.model_construct(steps=[])) is None and completion_tokens(None) is None


def test_greedy_sampling_or_a_batch_of_partial_groups_is_one_line_and_writes_nothing(tmp_path):
    greedy = _env_config(tmp_path / "greedy.yaml", tmp_path, temperature=0)
    run = CliRunner().invoke(app, ["train", "--objective", "grpo", "--config", str(greedy), "--base", str(tmp_path),
                                   "--output", str(tmp_path / "o")])
    one_error_line(run, "GRPO needs sampling")
    config = _env_config(tmp_path / "env.yaml", tmp_path)
    run = CliRunner().invoke(app, ["train", "--objective", "grpo", "--config", str(config), "--base", str(tmp_path),
                                   "--output", str(tmp_path / "o"), "--batch-size", "6", "--generations", "4"])
    one_error_line(run, "--batch-size 6 (x 1 accumulation) is not a multiple of --generations 4")
    assert not (tmp_path / "o").exists()


def test_a_bad_env_config_is_one_line_and_writes_nothing(tmp_path):
    config = tmp_path / "env.yaml"
    config.write_text(yaml.safe_dump({"env": "browser", "max_steps": "many"}))
    run = CliRunner().invoke(app, ["train", "--objective", "grpo", "--config", str(config), "--base", str(tmp_path),
                                   "--output", str(tmp_path / "o")])
    one_error_line(run, "max_steps")
    assert not (tmp_path / "o").exists()

"""`trajforge train` on a real export (retail demonstrations, trl-sft) with a tiny random model: the trainer's own
batches put loss only where the export's card says, two steps run, and the checkpoint carries its lineage."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from converters.export import ExportConfig, export
from flows.cli import app
from generators.runner import generate, load_config
from tests.cli_errors import one_error_line
from tests.export import _tiny
from training.trainer import TrainConfig, TrainError, build_trainer

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    cfg = load_config({"method": "demonstrations", "env": "retail", "tasks": {"n": 4}, "concurrency": 2})
    asyncio.run(generate(cfg, root / "demos"))
    export(root / "demos", root / "sft", ExportConfig(format="trl-sft"))
    return {"root": root, "export": root / "sft", "base": _tiny.shared_model_dir(tmp_path_factory)}


def test_the_trainers_batches_carry_loss_on_trainable_assistant_tokens_only(data, tmp_path):
    run = build_trainer(data["export"], str(data["base"]), tmp_path / "out", TrainConfig(max_steps=2, batch_size=2))
    assert run.settings.kwargs == {"assistant_only_loss": True, "max_length": None}  # the card's, as they are
    assert run.trainer.args.assistant_only_loss and run.trainer.args.max_length is None
    rows = _load(data["export"])
    total = _tiny.LossCount()
    for row_id, count in _tiny.sft_counts(run.trainer, run.trainer.processing_class, rows):
        assert count.environment == 0 and count.context == 0 and count.trainable > 0, (row_id, count)
        total += count
    assert total.trainable > 0


def test_train_command_writes_a_checkpoint_with_its_lineage_and_does_not_redo_it(data, tmp_path):
    out = tmp_path / "model"
    args = ["train", str(data["export"]), "--base", str(data["base"]), "--output", str(out), "--max-steps", "2",
            "--batch-size", "2", "--seed", "7", "--no-gradient-checkpointing"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    card = json.loads((out / "train.json").read_text())
    exported = json.loads((data["export"] / "card.json").read_text())
    assert card["steps"] == 2 and card["objective"] == "sft" and card["settings"]["seed"] == 7
    assert card["settings"]["gradient_checkpointing"] is False
    assert card["trl"] == {"config": "SFTConfig", "card_settings": {"assistant_only_loss": True, "max_length": None}}
    assert card["export"]["records"] == exported["counts"]["records_exported"] == 4
    assert len((out / "record_ids.txt").read_text().split()) == 4 and card["base"]["sha256"]
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file() and "## " not in card["output"]
    assert "Trained by `trajforge train`" in (out / "README.md").read_text()
    # The checkpoint is served as it is (the transformers backend reads the directory and its template).
    from backends.registry import make_llm

    llm = make_llm({"backend": "transformers", "model_path": str(out), "max_tokens": 2, "max_retries": 0})
    assert asyncio.run(llm.chat([{"role": "user", "content": "hi"}]))[0].usage.completion_tokens == 2
    asyncio.run(llm.aclose())
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "already trained" in again.output


def test_train_refuses_what_the_card_cannot_train_in_one_line(data, tmp_path):
    wrong = CliRunner().invoke(app, ["train", str(data["export"]), "--base", str(data["base"]), "--output",
                                     str(tmp_path / "a"), "--objective", "dpo"])
    assert wrong.exit_code == 1 and "does not fit a trl-sft export" in wrong.output
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    with pytest.raises(TrainError, match="no {% generation %} markers"):
        build_trainer(data["export"], str(data["base"]), tmp_path / "b", TrainConfig(chat_template=str(template)))
    missing = CliRunner().invoke(app, ["train", str(tmp_path), "--base", str(data["base"]), "--output", str(tmp_path / "c")])
    assert missing.exit_code == 1 and "not an export (no card.json)" in missing.output


def _load(export_dir):
    import datasets

    files = sorted(str(p) for p in (export_dir / "data").glob("train-*.parquet"))
    return datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=str(export_dir / ".hf"))


@pytest.mark.parametrize("fmt", ["trl-dpo", "trl-kto"])
def test_preference_exports_train_with_their_objective_and_a_reference_copy(fmt, tmp_path, tmp_path_factory):
    from tests.export import _data
    from training.trainer import train

    pair, chosen, rejected = _data.branch_pair()
    src = _data.store(tmp_path / "src", [_data.labeled_traj(), _data.failed_traj(), _data.tool_traj(), chosen,
                                         rejected], [pair])
    export(src, tmp_path / fmt, ExportConfig(format=fmt))
    card = train(tmp_path / fmt, str(_tiny.shared_model_dir(tmp_path_factory)), tmp_path / "model",
                 TrainConfig(max_steps=1, batch_size=2, gradient_checkpointing=False), log=lambda m: None)
    settings = json.loads((tmp_path / fmt / "card.json").read_text())
    assert card["objective"] == fmt.removeprefix("trl-") and card["steps"] == 1
    assert card["trl"]["config"] == ("DPOConfig" if fmt == "trl-dpo" else "KTOConfig")
    if fmt == "trl-kto":  # the weights this export's card computed, applied as they are
        assert set(card["trl"]["card_settings"]) == {"max_length", "desirable_weight", "undesirable_weight"}
        assert settings["format"] == "trl-kto"
    assert (tmp_path / "model" / "model.safetensors").is_file()


def test_train_refuses_a_non_empty_directory_it_did_not_write_and_resumes_its_own(data, tmp_path):
    base = ["--base", str(data["base"]), "--max-steps", "1", "--batch-size", "2"]
    card_before = (data["export"] / "README.md").read_text()
    into_export = CliRunner().invoke(app, ["train", str(data["export"]), "-o", str(data["export"]), *base])
    one_error_line(into_export, "not empty", "no train.json")
    assert (data["export"] / "README.md").read_text() == card_before and not (data["export"] / "config.json").exists()
    user = tmp_path / "mine"
    user.mkdir()
    (user / "README.md").write_text("my notes")
    refused = CliRunner().invoke(app, ["train", str(data["export"]), "-o", str(user), *base])
    one_error_line(refused, "not empty (README.md)")
    assert [p.name for p in user.iterdir()] == ["README.md"] and (user / "README.md").read_text() == "my notes"
    # Its own directory: a run killed after its checkpoint (no saved model yet) resumes there.
    out = tmp_path / "model"
    assert CliRunner().invoke(app, ["train", str(data["export"]), "-o", str(out), *base]).exit_code == 0
    for name in ("config.json", "model.safetensors"):
        (out / name).unlink()
    resumed = CliRunner().invoke(app, ["train", str(data["export"]), "-o", str(out), *base])
    assert resumed.exit_code == 0 and "resuming from" in resumed.output, resumed.output
    assert (out / "config.json").is_file()


def test_train_checks_the_chat_template_and_the_exports_data_before_loading_the_base(data, tmp_path, monkeypatch):
    import shutil

    import training.trainer as trainer

    def no_loading(*args, **kwargs):
        raise AssertionError("the base was loaded before the bad input was refused")

    monkeypatch.setattr(trainer, "load_model", no_loading)
    bad = CliRunner().invoke(app, ["train", str(data["export"]), "--base", str(data["base"]), "-o",
                                   str(tmp_path / "a"), "--chat-template", str(tmp_path / "nonexistent.jinja")])
    one_error_line(bad, "nonexistent.jinja: cannot read it")
    damaged = tmp_path / "damaged"
    shutil.copytree(data["export"], damaged, ignore=shutil.ignore_patterns("data"))
    gone = CliRunner().invoke(app, ["train", str(damaged), "--base", str(data["base"]), "-o", str(tmp_path / "b")])
    line = one_error_line(gone, "no data/ directory", "export it again")
    assert "not trained with TRL" not in line


def test_shared_prefix_step_has_trls_loss_and_gradients_on_a_real_batch(data, tmp_path):
    """The same batch through TRL's own SFT step and through the shared-prefix step: equal loss, gradients and
    logged metrics, while the rows' common prefix (system prompt, tool list) ran once."""
    import torch

    steps = {}
    for share in (False, True):
        cfg = TrainConfig(max_steps=1, batch_size=4, gradient_checkpointing=False, share_prefix=share)
        trainer = build_trainer(data["export"], str(data["base"]), tmp_path / str(share), cfg).trainer
        batch = next(iter(trainer.get_train_dataloader()))
        model = trainer.model
        model.train()
        model.zero_grad()
        labelled = (batch["labels"][:, 1:] != -100).sum()
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=labelled)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        steps[share] = (batch["input_ids"], loss.detach(), grads, dict(trainer._metrics["train"]),
                        getattr(trainer, "prefix_stats", None))
    (ids, loss, grads, metrics, _), (ids2, shared_loss, shared_grads, shared_metrics, stats) = steps[False], steps[True]
    assert torch.equal(ids, ids2) and ids.shape[0] == 4
    torch.testing.assert_close(shared_loss, loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared_grads, grads, rtol=1e-4, atol=1e-6)
    for name in ("entropy", "mean_token_accuracy", "num_tokens"):
        assert shared_metrics[name] == pytest.approx(metrics[name], rel=1e-4), name
    common = int((ids == ids[:1]).all(dim=0).long().cumprod(dim=0).sum())
    assert stats.shared_batches == 1 and stats.fallbacks == {}
    assert stats.tokens - stats.computed == 3 * min(common, _first_label(batch)) > 100


def _first_label(batch) -> int:
    return int((batch["labels"] != -100).any(dim=0).nonzero()[0]) - 1


def test_train_command_shares_prefixes_and_records_what_it_saved(data, tmp_path):
    base = ["--base", str(data["base"]), "--max-steps", "2", "--batch-size", "2", "--no-gradient-checkpointing"]
    shared = CliRunner().invoke(app, ["train", str(data["export"]), "-o", str(tmp_path / "a"), *base])
    assert shared.exit_code == 0, shared.output
    card = json.loads((tmp_path / "a" / "train.json").read_text())["prefix_sharing"]
    assert card["batches"] == card["batches_with_shared_prefix"] == 2 and 0 < card["tokens_computed"] < card["tokens"]
    assert f"{card['tokens_computed']:,} of {card['tokens']:,} tokens computed" in shared.output
    plain = CliRunner().invoke(app, ["train", str(data["export"]), "-o", str(tmp_path / "b"), *base, "--no-share-prefix"])
    assert plain.exit_code == 0 and "prefix_sharing" not in json.loads((tmp_path / "b" / "train.json").read_text())
    losses = [json.loads((tmp_path / d / "train.json").read_text())["train_loss"] for d in "ab"]
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)  # two steps of the same training

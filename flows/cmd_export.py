"""CLI command of the export stage: `trajforge export DIR --format F --output OUT`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flows.console import console, fail


def export(
    dataset: Annotated[Path, typer.Argument(help="Input trajforge dataset directory.")],
    format: Annotated[str, typer.Option("--format", "-f",
                                        help="trl-sft, trl-dpo, trl-kto, tokenized, rl, openai, sharegpt or atif.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output directory (a Hugging Face dataset).")],
    shard_rows: Annotated[int, typer.Option(help="Rows per output shard.")] = 50_000,
    mix: Annotated[Optional[str], typer.Option(
        help="source=weight,...: expected copies per record of each source (0.5 keeps about half, 2 doubles); "
             "unlisted sources are excluded.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the --mix sampling.")] = 0,
    reasoning: Annotated[Optional[bool], typer.Option(
        "--reasoning/--drop-reasoning",
        help="Keep reasoning as `reasoning_content` (default: kept, except for openai).")] = None,
    web_max_chars: Annotated[int, typer.Option(
        help="Truncate web page text (axtree/html) to this many chars (generated records keep the limit their "
             "model saw).")] = 20_000,
    sft_layout: Annotated[str, typer.Option(
        help="trl-sft layout: prompt-completion (one row per trainable segment; masked steps only ever in a prompt) "
             "or messages (one row per trajectory; refused where a step is masked, since TRL would train it).")] = "prompt-completion",
    history: Annotated[str, typer.Option(
        help="What rows of generated trajectories are conditioned on: request (exactly the request that produced "
             "each trained message: its system prompt, history window, pages as sent) or full (the whole history "
             "before it). Records that do not say how their prompts were rendered always get the full history.")
    ] = "request",
    kto_mode: Annotated[str, typer.Option(
        help="trl-kto rows: auto (steps where step labels exist, else turns), steps (labelled assistant messages), "
             "turns (every assistant message, labelled by success), trajectory (one multi-turn completion).")] = "auto",
    dpo_level: Annotated[str, typer.Option(
        help="trl-dpo rows: step (the next assistant message after the shared history) or trajectory "
             "(whole continuations; tool results become part of the preference).")] = "step",
    include_failed: Annotated[bool, typer.Option(
        help="Supervised formats (trl-sft, tokenized, openai, sharegpt): also export trajectories with success = false.")] = False,
    tokenizer: Annotated[Optional[str], typer.Option(
        help="--format tokenized: a tokenizer directory with a chat template (or a hub name when online).")] = None,
    max_length: Annotated[Optional[int], typer.Option(
        help="--format tokenized: longest row in tokens; longer trajectories are cut by turns.")] = None,
    tokens: Annotated[str, typer.Option(
        help="--format tokenized: rows of model calls that recorded their token ids (llm.token_ids) take them "
             "(recorded) or the chat template's render (rendered); the card counts rows where the two differ.")
    ] = "recorded",
    skip_unfit_rows: Annotated[bool, typer.Option(
        help="Skip (and count by reason) the rows the layout or chat template cannot train as recorded: masked steps "
             "in --sft-layout messages, turns or tools the --format tokenized template does not render. Default: "
             "the export stops with one line naming the record.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an earlier export in OUTPUT.")] = False,
) -> None:
    """Export interlingua shards as a training-ready dataset (TRL SFT/DPO/KTO, tokenized, RL rollouts, OpenAI, ShareGPT) or as ATIF."""
    from converters.export import ExportConfig
    from converters.export import export as run_export
    from converters.export.mix import MixError, parse_mix
    from converters.export.run import ExportError
    from flows.cmd_store import SHARD_READ_ERRORS, unreadable
    from schemas.store import StoreError

    try:
        cfg = ExportConfig(format=format, shard_rows=shard_rows, mix=parse_mix(mix), seed=seed, reasoning=reasoning,
                           web_max_chars=web_max_chars, sft_layout=sft_layout, history=history, kto_mode=kto_mode,
                           dpo_level=dpo_level,
                           include_failed=include_failed, tokenizer=tokenizer, max_length=max_length, tokens=tokens,
                           skip_unfit_rows=skip_unfit_rows, overwrite=overwrite)
    except MixError as exc:
        fail(str(exc))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"export {format}", total=None)
        try:
            report = run_export(dataset, output, cfg,
                                progress=lambda n: progress.advance(task, n),
                                total=lambda n: progress.update(task, total=n))
        except (ExportError, StoreError) as exc:
            progress.stop()
            fail(str(exc))
        except SHARD_READ_ERRORS as exc:
            progress.stop()
            fail(unreadable(dataset, exc))
    print_report(report)


def print_report(report: Any) -> None:
    """The export's counts: in, exported, rows, shards, skipped by reason."""
    table = Table(title=f"export {report.format} -> {report.output}", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    table.add_row("records in", str(report.records_in))
    table.add_row("exported", str(report.records_exported))
    table.add_row("rows written", str(report.rows))
    table.add_row("shards", str(len(report.files)))
    table.add_row("skipped", str(report.skipped_total))
    for reason, n in report.skipped.most_common():
        table.add_row(f"  {reason}", str(n))
    for note, n in sorted(report.notes.items()):
        table.add_row(note, str(n))
    console.print(table)
    console.print(next_step(report.format, report.output, report.files), highlight=False)


def next_step(fmt: str, out: Path, files: list[Path]) -> str:
    """What to do with the export: train it (TRL formats), hand it to its trainer, or read it (ATIF)."""
    from converters.export.guide import TRL_FORMATS

    readme = out / "README.md"
    if fmt in TRL_FORMATS:
        return f"train: trajforge train {out} --base MODEL -o DIR (the settings in {readme}, section Training)"
    if fmt == "atif":
        shown = files[0] if files else out / "data"
        return (f"ATIF is for viewers and tools, not a training format (trajforge train takes {', '.join(TRL_FORMATS)}); "
                f"read back with: trajforge convert --source atif --input {shown} -o DIR")
    return f"train with the settings in {readme} (section Training)"


def card(
    export_dir: Annotated[Path, typer.Argument(help="An export directory (made by trajforge export).")],
) -> None:
    """Regenerate the dataset card (README.md and plots/*.png) of an export directory from its card.json."""
    from converters.export.card import CardError, regenerate_card

    if not export_dir.is_dir():
        fail(f"{export_dir}: {'no such' if not export_dir.exists() else 'not an'} export directory "
             "(give the directory trajforge export wrote)")
    try:
        readme = regenerate_card(export_dir)
    except CardError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{export_dir}: cannot rebuild the card ({exc.strerror or exc})")
    plots = sorted(p.name for p in (export_dir / "plots").glob("*.png"))
    console.print(f"wrote {readme} and {len(plots)} plots: {', '.join(plots) or '-'}", highlight=False)

"""CLI command of the decontaminate stage: `trajforge decontaminate DIR --output OUT [--tasks CFG] [--reference F]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.config_file import ConfigFileError, read_config
from flows.console import beam_errors_reported_once, console, fail

# Beam pipeline options pass through to the runner, as for filter and dedup.
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}
DEFAULT_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def _task_sources(paths: list[Path]) -> list[tuple[object, str]]:
    from envs.tasks import TaskSourceConfig

    out = []
    for path in paths:
        try:
            data = read_config(path, "config")
        except ConfigFileError as exc:
            fail(str(exc))
        if not isinstance(data, dict) or not isinstance(data.get("tasks"), dict):
            fail(f"{path}: --tasks takes a config with a `tasks:` block (a method or environment config)")
        try:
            out.append((TaskSourceConfig.model_validate(data["tasks"]), str(data.get("env") or "unknown")))
        except ValueError as exc:
            fail(f"{path}: tasks: {str(exc).splitlines()[-1].strip()}")
    return out


def decontaminate_cmd(
    ctx: typer.Context,
    input_dir: Annotated[Path, typer.Argument(help="Input dataset directory.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output dataset directory.")],
    tasks: Annotated[list[Path], typer.Option(
        "--tasks", help="A config whose task source has a test split (tau2, miniwob, jsonl with metadata.split: "
                        "test): its test tasks are the reference. Repeatable.")] = [],  # noqa: B006
    reference: Annotated[list[Path], typer.Option(
        "--reference", "-r", help="A JSONL file of benchmark test items (strings, or objects with an instruction / "
                                  "question / prompt ...). Repeatable.")] = [],  # noqa: B006
    ngram: Annotated[int, typer.Option(help="Word n-gram length of the overlap check.", min=1)] = 13,
    threshold: Annotated[float, typer.Option(help="MinHash Jaccard of instructions that counts as a match.")] = 0.8,
    min_ngrams: Annotated[int, typer.Option(help="Overlapping n-grams needed for a match.", min=1)] = 1,
    num_perm: Annotated[int, typer.Option(help="MinHash permutations.", min=8)] = 128,
    runner: Annotated[str, typer.Option(help="Beam runner (class path or name).")] = DEFAULT_RUNNER,
    overwrite: Annotated[bool, typer.Option(help="Start the output afresh instead of resuming it.")] = False,
) -> None:
    """Drop records whose task or trajectory text overlaps benchmark test data (n-gram / MinHash); resumable.

    Unknown options (e.g. --direct_num_workers=2) are passed to Beam.
    """
    from envs.tasks import TaskFileError
    from filters.decontam import ReferenceFileError, file_references, held_out_references
    from pipelines.beam_runner import PipelineError
    from pipelines.decontam import run_decontam
    from schemas.store import StoreError

    if not tasks and not reference:
        fail("give the test data to check against: --tasks CONFIG (a task source with a test split) and/or "
             "--reference FILE.jsonl")
    try:
        refs = held_out_references(_task_sources(tasks))
        for path in reference:
            refs += file_references(path)
    except (TaskFileError, ReferenceFileError) as exc:
        fail(str(exc))
    if not refs:
        fail("the task sources given have no test split, and no --reference was given: nothing to check against")
    try:
        with beam_errors_reported_once():
            s = run_decontam(str(input_dir), str(output), refs, ngram=ngram, threshold=threshold, num_perm=num_perm,
                             min_ngrams=min_ngrams, runner=runner, beam_args=list(ctx.args), overwrite=overwrite)
    except PipelineError as exc:
        fail(f"{input_dir}: {exc}")
    except StoreError as exc:
        fail(str(exc))
    c = s.counts
    table = Table(title=f"decontaminate -> {s.output}", show_header=False)
    table.add_column("what")
    table.add_column("count", justify="right")
    for source, n in s.references.items():
        table.add_row(f"references: {source}", str(n))
    table.add_row("records in", str(c["in"]))
    table.add_row("kept", str(c["kept"]))
    table.add_row("dropped (overlap test data)", str(c["filtered"]))
    for source, n in s.by_source().items():
        table.add_row(f"  {source}", str(n))
    if c["pairs_in"]:
        table.add_row("pairs dropped (a trajectory dropped)", f"{c['pairs_dropped']} of {c['pairs_in']}")
    console.print(table)
    for e in s.examples[:5]:
        console.print(f"  e.g. {e['id']} ~ {e['reference_source']} {e['reference']} ({e['kind']}): "
                      f"{e['evidence']!r}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"in {c['in']} = kept {c['kept']} + dropped {c['filtered']}  ({s.shards_done}/{s.shards} shards run, "
                  f"{s.seconds:.1f}s)", highlight=False, markup=False)

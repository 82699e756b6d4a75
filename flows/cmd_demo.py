"""`trajforge demo`: the main job on the embedded default model, small enough for a laptop.

It converts the shipped ADP samples, generates a few rollouts in the built-in retail
environment with the embedded SmolLM2 model, exports both as TRL SFT datasets and prints
where everything is. Every stage resumes, so running it again finishes what is missing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
import yaml

from flows.cmd_convert import print_summary as print_convert_summary
from flows.cmd_export import print_report
from flows.cmd_generate import print_summary as print_generate_summary
from flows.console import console, fail
from flows.progress import RichProgress

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples" / "adp"
# Small training-data samples only (webarena_successful is evaluation data, never a training mix).
DEMO_DATASETS = (
    "agenttuning_alfworld", "agenttuning_db", "agenttuning_kg", "agenttuning_os",
    "agenttuning_webshop", "codeactinstruct", "mini-coder", "toucan_1_5m",
)
ROLLOUT_CONFIG = REPO / "configs" / "rollout_retail.yaml"


def demo(
    output: Annotated[Path, typer.Option("--output", "-o", help="Where the demo writes its datasets.")] = Path("out/demo"),
    tasks: Annotated[int, typer.Option(help="Retail tasks the embedded model attempts.")] = 2,
) -> None:
    """Convert the shipped samples, generate rollouts with the embedded model, export for training."""
    from converters.export import ExportConfig
    from converters.export import export as run_export
    from generators.runner import generate, load_config
    from pipelines.convert import run_convert
    from schemas.stats import dataset_stats
    from schemas.store import Dataset

    inputs = [str(SAMPLES / name / "sample_std.json") for name in DEMO_DATASETS]
    missing = [p for p in inputs if not Path(p).is_file()]
    if missing:
        fail(f"demo input missing: {missing[0]}")
    converted, generated = output / "converted", output / "generated" / "rollout"

    console.rule("[bold]1/3 convert the shipped ADP samples")
    print_convert_summary(run_convert("adp", inputs, str(converted)))

    console.rule("[bold]2/3 generate rollouts in the retail environment (embedded SmolLM2)")
    config = load_config({**yaml.safe_load(ROLLOUT_CONFIG.read_text()), "n_tasks": tasks})
    with RichProgress("rollout tasks") as progress:
        print_generate_summary(asyncio.run(generate(config, generated, progress=progress)))

    console.rule("[bold]3/3 export for training (TRL SFT)")
    exports = {}
    for name, source in (("converted", converted), ("generated", generated)):
        target = output / "export" / f"trl-sft-{name}"
        print_report(run_export(source, target, ExportConfig(format="trl-sft", overwrite=True)))
        exports[name] = target

    console.rule("[bold]done")
    for name, path in (("converted", converted), ("generated", generated)):
        stats = dataset_stats(Dataset.open(path))
        console.print(
            f"{name:10} {path}  records={stats['records']} quarantined={stats['quarantined']} "
            f"filtered={stats['filtered']} sources={len(stats['sources'])}"
        )
    for name, path in exports.items():
        console.print(f"export     {path}  (load with datasets.load_dataset('parquet', data_dir='{path}/data'))")
    console.print("Inspect with: trajforge stats DIR, trajforge validate DIR")

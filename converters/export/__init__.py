"""Exporters: interlingua shards -> training-ready datasets (TRL SFT/DPO/KTO, OpenAI, ShareGPT).

Modules, one job each:

- `render`   — a Trajectory -> chat turns (OpenAI-style messages tagged with the steps they came from).
- `tools`    — a Trajectory's tools -> JSON-Schema function specs.
- `sft`, `dpo`, `kto`, `openai`, `sharegpt` — pure functions: records -> output rows of one format.
- `formats`  — the registry of formats: row function, Arrow schema, file type, description.
- `mix`      — `--mix source=weight` parsing and the deterministic, streaming sampler.
- `pairs`    — streams preference pairs joined with their two trajectories (DuckDB, bounded memory).
- `writer`   — streams rows into `data/train-XXXXX-of-YYYYY.parquet` (zstd) or `.jsonl` shards.
- `card`     — the README.md dataset card (YAML front matter + DuckDB statistics).
- `run`      — the streaming export driver that ties them together and counts what was skipped.

The rendering rules are documented in `render` and in `docs/export.md`.
"""

from converters.export.formats import FORMATS
from converters.export.run import ExportConfig, ExportReport, export

__all__ = ["FORMATS", "ExportConfig", "ExportReport", "export"]

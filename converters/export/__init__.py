"""Exporters: interlingua shards -> training-ready datasets (TRL SFT/DPO/KTO, tokenized, OpenAI, ShareGPT).

Modules, one job each:

- `render`   — trajectories -> chat messages (the rules every format shares), column-wise into a buffer.
- `records`  — stored trajectories and pairs read column-wise, a batch at a time.
- `tools`    — a trajectory's tools -> JSON-Schema function specs.
- `sft`, `dpo`, `kto`, `openai_chat`, `sharegpt`, `tokenized` — pure functions: a record -> rows of one format.
- `formats`  — the registry of formats: row function, Arrow schema, file type, description; rows -> Arrow.
- `mix`      — `--mix source=weight` parsing and the deterministic, streaming sampler.
- `pairs`    — streams preference pairs joined with their two trajectories (DuckDB, bounded memory).
- `writer`   — streams Arrow batches into `data/train-XXXXX-of-YYYYY.parquet` (zstd) or `.jsonl` shards.
- `guide`    — the trainer settings each export is correct under (shown on the card).
- `card`     — the README.md dataset card (YAML front matter + DuckDB statistics + plots).
- `run`      — the streaming export driver that ties them together and counts what was skipped.
- `preview`  — one trajectory in one format as the trainer loads it, with its loss tokens (viewers).

The rendering rules are documented in `render` and in `docs/export.md`.
"""

from converters.export.formats import FORMATS
from converters.export.preview import Preview, TokenView, preview
from converters.export.run import ExportConfig, ExportReport, export

__all__ = ["FORMATS", "ExportConfig", "ExportReport", "Preview", "TokenView", "export", "preview"]

"""`trajforge train EXPORT --base MODEL --output OUT`: TRL on an export, with exactly the settings its card gives.

The export's `card.json` names its format, hence the objective and the TRL config under which its
loss masks are exact (`converters.export.guide.trainer_settings`: `assistant_only_loss=True,
max_length=None` for trl-sft, the KTO weights of that export, ...); those arguments are applied as
they are, and what is ours to choose (epochs, learning rate, batch size, LoRA, seed) comes from
`TrainConfig`. The base is a Hugging Face model directory or a GGUF file (loaded by transformers'
GGUF support). `chat_template` replaces the base's template for training and is saved with the
checkpoint, so the model is served with the template it was trained on.

    OUT/config.json, model.safetensors, tokenizer files   the checkpoint (LoRA adapters merged in)
    OUT/train.json          lineage: the export (path, format, card, records), the base, settings, seed, losses
    OUT/record_ids.txt      the ids of the records behind the rows trained on
    OUT/README.md           a model card with the same
    OUT/checkpoints/        the trainer's checkpoints: a killed run resumes from the last one

OUT is a new or empty directory, or one `train` wrote (its `train.json` is written first): a
non-empty directory without it (a user's folder, the export itself) is refused.

Seeded (`seed`: initialisation, data order, dropout). A finished run with the same inputs and
settings is not run again.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from backends.transformers_backend import load_model, resolve_chat_template
from converters.export.guide import TRL_FORMATS, TrainerSettings, trainer_settings
from schemas.outdir import ForeignDirError, check_output_dir
from training.shared_prefix import prefix_sharing_sft_trainer

CARD = "train.json"
RECORD_IDS = "record_ids.txt"
CHECKPOINTS = "checkpoints"


class TrainError(ValueError):
    """The export, the base or the settings cannot be trained on; the message is one line."""


class TrainConfig(BaseModel):
    """What `trajforge train` chooses beside the card's settings (also the `train:` block of an improve config)."""

    model_config = ConfigDict(extra="forbid")

    objective: Literal["sft", "dpo", "kto"] | None = Field(None, description="default: the export's (trl-sft: sft, ...)")
    lora: bool = Field(False, description="train LoRA adapters (merged into the saved checkpoint) instead of every weight")
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps (overrides epochs)")
    learning_rate: float | None = Field(None, gt=0, description="default: 5e-5, or 2e-4 with LoRA")
    batch_size: int = Field(4, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="share of the steps that warm the learning rate up")
    lr_scheduler: str = "linear"
    seed: int = 0
    chat_template: str | None = Field(None, description="a TRL template name, a .jinja file or the text; saved with the "
                                                        "checkpoint (default: the base's own)")
    device: str | None = Field(None, description="cuda or cpu (default: cuda where there is one)")
    gradient_checkpointing: bool | None = Field(None, description="recompute activations in the backward pass "
                                                                  "(less memory, slower; default: TRL's, on)")
    share_prefix: bool = Field(True, description="SFT: run the tokens every row of a batch starts with once, and the LM "
                                                 "head only where a token is trained (same loss and gradients, less "
                                                 "work: training/shared_prefix.py)")
    save_steps: int = Field(200, ge=1, description="checkpoint every this many steps (what a killed run resumes from)")
    logging_steps: int = Field(5, ge=1)

    def lr(self) -> float:
        return self.learning_rate or (2e-4 if self.lora else 5e-5)


# ---- inputs -------------------------------------------------------------------------------------


def read_export(export: Path) -> tuple[dict[str, Any], list[Path]]:
    """(the export's card data, its Parquet shards)."""
    try:
        card = json.loads((export / "card.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TrainError(f"{export}: not an export (no card.json); make one with trajforge export") from None
    except (OSError, ValueError) as exc:
        raise TrainError(f"{export}/card.json: cannot read it ({exc})") from None
    settings_for(card, None)  # a format TRL does not train has no shards to look for
    files = sorted((export / "data").glob("train-*.parquet"))
    if not files:
        held = "no data/ directory" if not (export / "data").is_dir() else "no train-*.parquet shard in data/"
        raise TrainError(f"{export}: {held}; the export's data is missing (moved or deleted): export it again")
    return card, files


def settings_for(card: dict[str, Any], objective: str | None) -> TrainerSettings:
    settings = trainer_settings(card)
    if settings is None:
        raise TrainError(f"format {card.get('format')!r} is not trained with TRL ({', '.join(TRL_FORMATS)} are)")
    if objective is not None and objective != settings.objective:
        raise TrainError(f"--objective {objective} does not fit a {card['format']} export (it trains {settings.objective})")
    return settings


def file_digest(path: Path) -> str:
    """sha256 of a file, or of a directory's weight and config files (names and bytes)."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file() and (
        p.suffix in (".safetensors", ".bin", ".gguf", ".json") or p.name.endswith(".model")))
    for p in files:
        h.update(p.name.encode())
        with p.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def run_key(export_card: dict[str, Any], base_digest: str, cfg: TrainConfig) -> str:
    """What a finished run is: the same export, base and settings give the same key."""
    what = [export_card.get("counts"), export_card.get("source"), export_card.get("format"), base_digest,
            cfg.model_dump(mode="json", exclude={"device", "save_steps", "logging_steps"})]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def finished(output: Path, key: str) -> dict[str, Any] | None:
    try:
        card = json.loads((output / CARD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return card if card.get("key") == key and (output / "config.json").is_file() else None


# ---- the trainer --------------------------------------------------------------------------------


@dataclass
class Run:
    """A TRL trainer ready to train (its dataset tokenized, its collator built), and what it was built from."""

    trainer: Any
    card: dict[str, Any]
    settings: TrainerSettings
    files: list[Path]
    device: str


def build_trainer(export: Path, base: str, output: Path, cfg: TrainConfig, *, model: Any = None,
                  tokenizer: Any = None) -> Run:
    """The run's trainer; `model` / `tokenizer` skip loading the base (tests hand in tiny ones)."""
    import datasets
    import torch

    card, files = read_export(export)
    settings = settings_for(card, cfg.objective)
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    template = _chat_template(cfg)  # a bad template is refused before the base is loaded
    if model is None or tokenizer is None:
        try:
            model, tokenizer = load_model(base, device=device, train=True)
        except (ValueError, OSError) as exc:
            raise TrainError(f"base {base}: {str(exc).splitlines()[0]}") from None
    if template is not None:
        tokenizer.chat_template = template
    if settings.kwargs.get("assistant_only_loss"):
        _check_markers(tokenizer)
    data = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train",
                                 cache_dir=str(output / ".hf-cache"))
    import trl

    config_cls, trainer_cls = getattr(trl, settings.config), getattr(trl, settings.trainer)
    if settings.objective == "sft" and cfg.share_prefix:
        trainer_cls = prefix_sharing_sft_trainer(trainer_cls)
    args = config_cls(
        output_dir=str(output / CHECKPOINTS), **settings.kwargs,
        num_train_epochs=cfg.epochs, max_steps=cfg.max_steps or -1, learning_rate=cfg.lr(),
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        warmup_steps=cfg.warmup_ratio, lr_scheduler_type=cfg.lr_scheduler, seed=cfg.seed, data_seed=cfg.seed,
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=2, logging_steps=cfg.logging_steps,
        report_to=[], use_cpu=device == "cpu", dataloader_num_workers=0,
        **({} if cfg.gradient_checkpointing is None else {"gradient_checkpointing": cfg.gradient_checkpointing}),
        bf16=device == "cuda" and torch.cuda.is_bf16_supported())
    extra: dict[str, Any] = {}
    if cfg.lora:
        from peft import LoraConfig

        extra["peft_config"] = LoraConfig(task_type="CAUSAL_LM", r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                          target_modules="all-linear")
    elif settings.objective in ("dpo", "kto"):
        # The frozen reference policy: a second copy of the base (TRL would otherwise load it by name).
        extra["ref_model"] = load_model(base, device=device, train=True)[0]
    trainer = trainer_cls(model=model, args=args, train_dataset=data, processing_class=tokenizer, **extra)
    return Run(trainer, card, settings, files, device)


def _chat_template(cfg: TrainConfig) -> str | None:
    try:
        return resolve_chat_template(cfg.chat_template)
    except ValueError as exc:
        raise TrainError(str(exc)) from None


def _check_markers(tokenizer: Any) -> None:
    """assistant_only_loss needs `{% generation %}` markers, or a training template TRL has for the family."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if template and has_generation_markers(template):
        return
    try:
        if get_training_chat_template(tokenizer) is not None:
            return
    except Exception:  # noqa: BLE001 - TRL knows no training template for this family
        pass
    raise TrainError("the base's chat template has no {% generation %} markers and TRL has no training template for "
                     "it, so assistant_only_loss cannot mask the loss: give a chat template with markers (--chat-template, "
                     "e.g. qwen2_5_training for ChatML models) or export with --format tokenized --tokenizer BASE")


def train(export: str | Path, base: str, output: str | Path, cfg: TrainConfig, *, log: Any = print) -> dict[str, Any]:
    """Train, save the checkpoint and its card in `output`; resumes a killed run; returns the card."""
    export, output = Path(export), Path(output)
    base_path = Path(base)
    if not base_path.exists():
        raise TrainError(f"base {base}: no such file or directory")
    card, _ = read_export(export)
    settings_for(card, cfg.objective)
    _chat_template(cfg)
    try:
        check_output_dir(output, CARD, "a trajforge train output")
    except ForeignDirError as exc:
        raise TrainError(str(exc)) from None
    base_digest = file_digest(base_path)
    key = run_key(card, base_digest, cfg)
    if (done := finished(output, key)) is not None:
        log(f"already trained with the same export, base and settings: {output}")
        return done
    output.mkdir(parents=True, exist_ok=True)
    if not (output / CARD).is_file():  # the mark that this directory is ours: a killed run resumes in it
        (output / CARD).write_text(json.dumps({"status": "training", "output": str(output.resolve())}) + "\n",
                                   encoding="utf-8")
    started = time.time()
    run = build_trainer(export, base, output, cfg)
    trainer, settings = run.trainer, run.settings
    resume = _last_checkpoint(output / CHECKPOINTS)
    if resume is not None:
        log(f"resuming from {resume}")
    result = trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    model = trainer.model
    if cfg.lora:
        model.save_pretrained(str(output / "adapter"))
        model = model.merge_and_unload()
    model.save_pretrained(str(output))
    trainer.processing_class.save_pretrained(str(output))
    ids = _export_ids(run.files)
    (output / RECORD_IDS).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    losses = [{"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e]
    out = {
        "key": key, "output": str(output.resolve()), "trajforge_version": _version(),
        "export": {"path": str(export.resolve()), "format": card["format"], "source": card.get("source"),
                   "counts": card.get("counts"), "card_sha256": file_digest(export / "card.json"),
                   "records": len(ids), "record_ids": RECORD_IDS},
        "base": {"path": str(base_path.resolve()), "sha256": base_digest},
        "objective": settings.objective, "trl": {"config": settings.config, "card_settings": settings.kwargs},
        "settings": cfg.model_dump(mode="json"), "learning_rate": cfg.lr(), "device": run.device,
        "rows": len(trainer.train_dataset), "steps": trainer.state.global_step,
        "train_loss": result.training_loss, "losses": losses, "resumed_from": str(resume) if resume else None,
        "seconds": round(time.time() - started, 1),
    }
    if (stats := getattr(trainer, "prefix_stats", None)) is not None:
        out["prefix_sharing"] = stats.as_dict()
    (output / CARD).write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
    (output / "README.md").write_text(model_card(out), encoding="utf-8")
    return out


def _last_checkpoint(folder: Path) -> Path | None:
    found = [p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


def _export_ids(files: list[Path]) -> list[str]:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for f in files:
        table = pq.read_table(f, columns=["id"]) if "id" in pq.read_schema(f).names else None
        if table is not None:
            ids.update(str(v) for v in table.column("id").to_pylist())
    return sorted(ids)


def _version() -> str:
    from generators.base import trajforge_version

    return trajforge_version()


def model_card(card: dict[str, Any]) -> str:
    e, b = card["export"], card["base"]
    args = ", ".join(f"{k}={v!r}" for k, v in card["trl"]["card_settings"].items())
    s = card["settings"]
    lines = [
        "---", "library_name: transformers", "tags: [trajforge, trl, " + card["objective"] + "]", "---", "",
        f"# {Path(card['output']).name}", "",
        f"Trained by `trajforge train` ({card['objective']}, TRL `{card['trl']['config']}({args})` as the export's card "
        f"prescribes{', LoRA merged' if s['lora'] else ''}).", "",
        "| lineage | |", "|---|---|",
        f"| export | `{e['path']}` ({e['format']}; card sha256 `{e['card_sha256'][:16]}`) |",
        f"| exported from | `{e.get('source') or '-'}` |",
        f"| records | {e['records']:,} (ids in `{e['record_ids']}`), rows {card['rows']:,} |",
        f"| base | `{b['path']}` (sha256 `{b['sha256'][:16]}`) |",
        f"| chat template | {s.get('chat_template') or 'the base model’s own'} |",
        f"| steps | {card['steps']:,} (epochs {s['epochs']:g}, batch {s['batch_size']} x {s['gradient_accumulation_steps']}, "
        f"lr {card['learning_rate']:g}, seed {s['seed']}) |",
        f"| final training loss | {card['train_loss']:.4f} |",
        f"| time | {card['seconds']:.0f} s on {card['device']} |",
        f"| trajforge | {card['trajforge_version']} |", "",
    ]
    return "\n".join(lines)

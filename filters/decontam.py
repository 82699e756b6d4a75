"""Decontamination: does a record overlap a benchmark's test data?

References are test items: the test tasks of a task source that has a test split (tau2's test
tasks, MiniWoB's test seeds, JSONL tasks marked `metadata.split: test`; `task_references`) and any
JSONL file of benchmark items (`file_references`: one string or object per line). Each has an
instruction (the task text) and a text (everything it says: for a tau2 task, the whole user
scenario).

A record matches a reference, first rule first:
1. `exact instruction`: its task instruction equals a reference's (lower-cased words), unless the
   reference's instruction is `templated` (a source's template shared by its splits: MiniWoB);
2. `similar instruction`: the MinHash estimate of the Jaccard similarity of the two instructions'
   word 5-grams reaches `threshold` (LSH candidates, then the full signature);
3. `n-gram`: at least `min_ngrams` word n-grams (13 by default, as in GPT-3's and Llama's
   decontamination) of its instruction or trajectory text appear in a reference's text.

A record's task instruction is `details["task"]["instruction"]` (generated records), else its
first user turn (never the system step). Its trajectory text is what the user and the agent said
and did: user turns, agent messages, thoughts, code and tool-call arguments (the system prompt and
tool results are shared by unrelated records and left out). MinHash signatures and n-gram hashes
come from filters/dedup.py (datasketch's permutations, the same n-gram fold; 64-bit n-gram hashes, so
a large reference set gives no chance matches).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from filters.dedup import (
    DEFAULT_NUM_PERM,
    Signer,
    band_hashes,
    estimated_jaccard,
    fold_shingles,
    lsh_params,
    normalized_words,
    step_columns,
)

DEFAULT_NGRAM = 13
DEFAULT_THRESHOLD = 0.8
INSTRUCTION_SHINGLE = 5  # word n-grams of instructions for MinHash (short texts: small shingles)
MAX_REFERENCE_CHARS = 200_000
# JSONL reference keys that hold an item's task text, in order of preference.
INSTRUCTION_KEYS = ("instruction", "question", "prompt", "query", "task", "problem", "input", "intent", "goal", "text")
_STEP_FIELDS = ("kind", "source", "name", "content", "function", "arguments", "thought", "reasoning")


def _hashes(words: list[str]) -> np.ndarray:
    """A 64-bit hash of each word: Python's own string hash, which is fast but differs between processes
    (PYTHONHASHSEED), so an index is always rebuilt from its references in the process that uses it."""
    return np.fromiter(map(hash, words), dtype=np.int64, count=len(words)).view(np.uint64)


def _text_shingles(text: str, n: int, bits: int) -> np.ndarray:
    words = normalized_words(text)
    return fold_shingles(_hashes(words.split(" ")), n, bits) if words else np.empty(0, np.uint64)


class ReferenceFileError(ValueError):
    """A reference file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Reference:
    """One test item: where it is from (`source`: e.g. "tau2 test tasks"), its id, task text and whole text."""

    id: str
    source: str
    instruction: str
    text: str
    # The instruction is a template instance the source shares between its splits by design (MiniWoB: another
    # seed of the same page says the same words over another page), so only the n-gram rule reads it.
    templated: bool = False


@dataclass(frozen=True)
class Match:
    reference: Reference
    kind: str  # exact instruction | similar instruction | n-gram
    score: float  # 1.0, the estimated Jaccard, or the share of the record's n-grams found in the reference
    evidence: str  # the overlapping words

    def reason(self, ngram: int) -> str:
        what = f"{ngram}-gram overlap" if self.kind == "n-gram" else self.kind
        return f"{what} with {self.reference.source} {self.reference.id}: {self.evidence!r}"


# ---- references ------------------------------------------------------------------------------------


def task_references(tasks: Iterable[Any], source: str) -> list[Reference]:
    """References of test-split tasks (envs.base.Task): the instruction and, for tau2, the user scenario."""
    from envs.users import scenario_text

    out = []
    for task in tasks:
        scenario = scenario_text(task) if isinstance(task.metadata.get("user_scenario"), dict) else ""
        out.append(Reference(task.id, source, task.instruction, f"{task.instruction}\n{scenario}".strip(),
                             templated=bool(task.metadata.get("templated_instruction"))))
    return out


def _strings(value: Any, out: list[str], budget: list[int]) -> None:
    if budget[0] <= 0:
        return
    if isinstance(value, str):
        out.append(value)
        budget[0] -= len(value)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out, budget)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out, budget)


def file_references(path: str | Path) -> list[Reference]:
    """A JSONL file of test items: each line a string, or an object whose task text is the first of
    `INSTRUCTION_KEYS` it has and whose text is every string in it; `id` / `task_id` name it."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReferenceFileError(f"{path}: cannot read the reference file ({getattr(exc, 'strerror', None) or exc})") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReferenceFileError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if isinstance(row, str):
            instruction, text, ref_id = row, row, f"{path.name}:{n}"
        elif isinstance(row, dict):
            instruction = next((row[k] for k in INSTRUCTION_KEYS if isinstance(row.get(k), str)), "")
            parts: list[str] = []
            _strings(row, parts, [MAX_REFERENCE_CHARS])
            text = "\n".join(parts)
            ref_id = str(row.get("id") or row.get("task_id") or f"{path.name}:{n}")
        else:
            raise ReferenceFileError(f"{path}:{n}: a reference is a string or an object, not {type(row).__name__}")
        if not normalized_words(text):
            raise ReferenceFileError(f"{path}:{n}: the reference has no text")
        out.append(Reference(ref_id, f"file {path.name}", instruction, text))
    if not out:
        raise ReferenceFileError(f"{path}: no references in the file")
    return out


# ---- the index ---------------------------------------------------------------------------------------


class ReferenceIndex:
    """References as sorted n-gram hashes, exact instructions and MinHash LSH bands, for fast lookups."""

    def __init__(self, references: Sequence[Reference], *, ngram: int = DEFAULT_NGRAM,
                 threshold: float = DEFAULT_THRESHOLD, num_perm: int = DEFAULT_NUM_PERM, min_ngrams: int = 1) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if ngram < 1 or min_ngrams < 1:
            raise ValueError("ngram and min_ngrams must be >= 1")
        self.references = list(references)
        self.ngram, self.threshold, self.num_perm, self.min_ngrams = ngram, threshold, num_perm, min_ngrams
        self.signer = Signer(num_perm, INSTRUCTION_SHINGLE)
        self.params = lsh_params(threshold, num_perm)
        hashes, owners = [], []
        for i, ref in enumerate(self.references):
            if ref.templated and len(normalized_words(ref.text).split()) < ngram:
                continue  # shorter than one n-gram: its one shingle is the template's words themselves
            h = np.unique(_text_shingles(ref.text, ngram, 64))
            if len(h):
                hashes.append(h)
                owners.append(np.full(len(h), i, dtype=np.int64))
        all_h = np.concatenate(hashes) if hashes else np.empty(0, np.uint64)
        all_o = np.concatenate(owners) if owners else np.empty(0, np.int64)
        order = np.lexsort((all_o, all_h))
        all_h, all_o = all_h[order], all_o[order]
        first = np.r_[True, all_h[1:] != all_h[:-1]] if len(all_h) else np.empty(0, bool)
        self.hashes, self.owner = all_h[first], all_o[first]
        self.exact = {}
        for i, ref in enumerate(self.references):
            if not ref.templated:
                self.exact.setdefault(normalized_words(ref.instruction), i)
        self.exact.pop("", None)
        with_instruction = [i for i, r in enumerate(self.references) if normalized_words(r.instruction) and not r.templated]
        self.sig_owner = np.array(with_instruction, dtype=np.int64)
        self.sigs = np.stack([self.signer.sign_shingles(_text_shingles(self.references[i].instruction,
                                                                        INSTRUCTION_SHINGLE, 32))
                              for i in with_instruction]) if with_instruction else np.empty((0, num_perm), np.uint32)
        bands = band_hashes(self.sigs, self.params) if len(with_instruction) else np.empty((0, self.params.bands), np.uint64)
        self.band_order = np.argsort(bands, axis=0, kind="stable")
        self.band_sorted = np.take_along_axis(bands, self.band_order, axis=0)

    def __len__(self) -> int:
        return len(self.references)

    def match(self, instruction: str, text: str) -> Match | None:
        """The first rule that matches the record with this instruction and trajectory text, else None."""
        return self.match_many([(instruction, text)])[0]

    def match_many(self, records: Sequence[tuple[str, str]]) -> list[Match | None]:
        """`match` for a batch of (instruction, trajectory text): signatures, bands and n-gram lookups at once."""
        norms = [normalized_words(instruction) for instruction, _ in records]
        out: list[Match | None] = [None] * len(records)
        for r, norm in enumerate(norms):
            if norm and norm in self.exact:
                out[r] = Match(self.references[self.exact[norm]], "exact instruction", 1.0, _cut(norm))
        # One pass over the words: the instruction's hashes start the record's (instruction, then text).
        words = [f"{norm} {normalized_words(text)}".strip().split(" ") if out[r] is None else []
                 for r, (norm, (_, text)) in enumerate(zip(norms, records))]
        hashes = [_hashes(w) if w != [""] else np.empty(0, np.uint64) for w in words]
        todo = [r for r, norm in enumerate(norms) if out[r] is None and norm]
        if todo and len(self.sigs):
            shingles = [fold_shingles(hashes[r][:norms[r].count(" ") + 1], INSTRUCTION_SHINGLE, 32) for r in todo]
            self._similar(todo, norms, shingles, out)
        todo = [r for r in range(len(records)) if out[r] is None and len(hashes[r])]
        if todo and len(self.hashes):
            self._ngrams(todo, words, hashes, out)
        return out

    def _similar(self, todo: list[int], norms: list[str], shingles: list[np.ndarray], out: list[Match | None]) -> None:
        sigs = np.stack([self.signer.sign_shingles(sh) for sh in shingles])
        bands = band_hashes(sigs, self.params)
        candidates: dict[int, set[int]] = {}
        for b in range(self.params.bands):
            column = self.band_sorted[:, b]
            lo = np.searchsorted(column, bands[:, b], "left")
            hi = np.searchsorted(column, bands[:, b], "right")
            for k in np.flatnonzero(hi > lo).tolist():
                candidates.setdefault(k, set()).update(self.band_order[lo[k]:hi[k], b].tolist())
        for k, found in candidates.items():
            rows = np.array(sorted(found), dtype=np.int64)
            sims = estimated_jaccard(self.sigs[rows], sigs[k][None, :])
            best = int(np.argmax(sims))
            if sims[best] >= self.threshold:
                ref = self.references[int(self.sig_owner[rows[best]])]
                out[todo[k]] = Match(ref, "similar instruction", round(float(sims[best]), 3), _cut(norms[todo[k]]))

    def _ngrams(self, todo: list[int], words: list[list[str]], hashes: list[np.ndarray],
                out: list[Match | None]) -> None:
        grams = [fold_shingles(hashes[r], self.ngram, bits=64) for r in todo]
        lengths = np.array([len(g) for g in grams], dtype=np.int64)
        flat = np.concatenate(grams)
        pos = np.searchsorted(self.hashes, flat)
        pos[pos >= len(self.hashes)] = 0
        found = self.hashes[pos] == flat
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        counts = np.add.reduceat(found.astype(np.int64), starts)
        for k in np.flatnonzero(counts >= self.min_ngrams).tolist():
            a, n = int(starts[k]), int(lengths[k])
            at = int(np.flatnonzero(found[a:a + n])[0])
            owner = int(self.owner[pos[a + at]])
            evidence = " ".join(words[todo[k]][at:at + self.ngram])
            out[todo[k]] = Match(self.references[owner], "n-gram", round(float(counts[k]) / n, 3), _cut(evidence))

    # ---- shipping the index to workers ----------------------------------------------------------

    def save(self, path: Path) -> None:
        settings = {"ngram": self.ngram, "threshold": self.threshold, "num_perm": self.num_perm,
                    "min_ngrams": self.min_ngrams}
        path.write_text(json.dumps({"settings": settings, "references": [asdict(r) for r in self.references]}))

    @classmethod
    def load(cls, path: Path) -> ReferenceIndex:
        data = json.loads(path.read_text())
        return cls([Reference(**r) for r in data["references"]], **data["settings"])

    def digest(self) -> str:
        import hashlib

        body = json.dumps([asdict(r) for r in self.references], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def _cut(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit] + " …"


# ---- a record's texts, column-wise ---------------------------------------------------------------------


def record_texts(batch: pa.RecordBatch | pa.Table) -> list[tuple[str, str]]:
    """(task instruction, trajectory text) of each trajectory row (columns `steps`, `details`)."""
    offsets, cols = step_columns(batch, _STEP_FIELDS)
    details = batch.column("details").to_pylist() if "details" in batch.schema.names else [None] * len(batch)
    out = []
    for r in range(len(batch)):
        instruction = _task_instruction(details[r])
        parts = []
        for i in range(int(offsets[r]), int(offsets[r + 1])):
            kind, source, name = cols["kind"][i], cols["source"][i], cols["name"][i]
            if kind == "text" and source == "user" and name != "system":
                if instruction is None:
                    instruction = cols["content"][i] or ""  # matched as the instruction: not again as text
                else:
                    parts.append(cols["content"][i] or "")
            elif kind in ("message", "code", "api") or (kind == "text" and source == "agent"):
                parts += [cols["thought"][i] or "", cols["reasoning"][i] or "", cols["content"][i] or "",
                          cols["arguments"][i] or "" if kind == "api" else ""]
        out.append((instruction or "", "\n".join(p for p in parts if p)))
    return out


def _task_instruction(details: str | None) -> str | None:
    if not details:
        return None
    try:
        task = json.loads(details).get("task")
    except (ValueError, AttributeError):
        return None
    instruction = task.get("instruction") if isinstance(task, dict) else None
    return instruction if isinstance(instruction, str) and instruction.strip() else None


# ---- where references come from --------------------------------------------------------------------


def held_out_references(sources: Iterable[tuple[Any, str]]) -> list[Reference]:
    """References of the test splits of task sources: `(TaskSourceConfig, env name)` pairs; sources
    without a test split give none. Each test task counts once, however many configs name it."""
    from envs.tasks import held_out_tasks

    out: dict[tuple[str, str], Reference] = {}
    seen: set[str] = set()
    for config, env in sources:
        key = json.dumps([config.source, config.path, config.options, env], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        tasks = held_out_tasks(config, env)
        for ref in task_references(tasks or [], f"{config.source} test tasks"):
            out.setdefault((ref.source, ref.id), ref)
    return list(out.values())

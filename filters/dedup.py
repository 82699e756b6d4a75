"""Dedup helpers: normalized exact hashes, word n-gram shingles, MinHash signatures, LSH band
hashes, parameters for a Jaccard threshold, and connected components of candidate edges.

Everything works on Arrow batches of the trajectories table (columns `id`, `steps`) without
building pydantic models, so signing runs at numpy speed. Signatures are datasketch MinHash
values (scheme affine32, seed 1): `LeanMinHash(seed=1, hashvalues=sig, scheme="affine32")`
rebuilds one for inspection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import orjson
import pyarrow as pa
import xxhash
from datasketch import MinHash

SEED = 1
SCHEME = "affine32"
DEFAULT_NGRAM = 5
DEFAULT_THRESHOLD = 0.8
DEFAULT_NUM_PERM = 128
_WS = re.compile(r"\s+")
_WORD = re.compile(r"\w+")
_FNV = np.uint64(0x100000001B3)
_M32 = np.uint64(0xFFFFFFFF)
# Kinds whose text counts for near-duplicate detection: what the agent does and says, and
# what the user asks. Environment output (pages, tool results) is left out: it is long and
# shared by unrelated trajectories on the same site or tool.
_NEAR_KINDS = frozenset({"api", "code", "message"})
_STEP_FIELDS = ("kind", "source", "function", "arguments", "language", "content", "url", "html", "axtree")


def _norm(text: str | None) -> str:
    return _WS.sub(" ", text).strip() if text else ""


def _canonical_args(text: str | None) -> str:
    if not text:
        return ""
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONDecodeError:
        return _norm(text)


def step_columns(batch: pa.RecordBatch | pa.Table, fields: Sequence[str]) -> tuple[np.ndarray, dict[str, list[Any]]]:
    """The `steps` column of trajectory rows as list offsets and the named step fields, flat (one pass
    each; row i's steps are `offsets[i]:offsets[i + 1]`)."""
    steps = batch.column("steps")
    if isinstance(steps, pa.ChunkedArray):
        steps = steps.combine_chunks()
    flat = steps.values
    return steps.offsets.to_numpy(), {name: flat.field(name).to_pylist() for name in fields}


def batch_texts(batch: pa.RecordBatch | pa.Table) -> tuple[list[str], list[str]]:
    """(exact keys, near texts) for each row of a trajectories batch.

    Exact key: every step's kind and content, whitespace-normalized, arguments with sorted
    keys; no ids, tool_call_ids, timestamps, rewards or extras. Near text: lower-cased
    actions and user turns.
    """
    offsets, cols = step_columns(batch, _STEP_FIELDS)
    kinds, contents = cols["kind"], cols["content"]
    exact, near = [], []
    for d in range(len(batch)):
        e_parts, n_parts = [], []
        for i in range(offsets[d], offsets[d + 1]):
            kind = kinds[i]
            if kind == "api":
                fn, args = cols["function"][i] or "", _canonical_args(cols["arguments"][i])
                e_parts.append(f"api\x1f{fn}\x1f{args}")
                n_parts.append(f"{fn} {args}")
            else:
                body = _norm(contents[i]) if kind != "web" else _norm(
                    f"{cols['url'][i] or ''} {cols['axtree'][i] or cols['html'][i] or ''}")
                e_parts.append(f"{kind}\x1f{cols['source'][i] or ''}\x1f{cols['language'][i] or ''}\x1f{body}")
                if kind in _NEAR_KINDS or (kind == "text" and cols["source"][i] == "user"):
                    n_parts.append(body)
        exact.append("\x1e".join(e_parts))
        near.append(" ".join(n_parts).lower())
    return exact, near


def exact_hash(text: str) -> int:
    # 64-bit xxh3: the chance of any collision among 1e6 records is ~3e-8 (1e8 records: ~3e-4).
    return xxhash.xxh3_64_intdigest(text.encode())


def shingle_hashes(text: str, ngram: int = DEFAULT_NGRAM, bits: int = 32) -> np.ndarray:
    """Hashes of the word n-grams of `text` (one shingle for texts shorter than n words): 32-bit for
    MinHash; 64-bit (`bits=64`) where shingles are looked up in large sets (decontamination)."""
    words = _WORD.findall(text)
    if not words:
        return np.zeros(1, dtype=np.uint64)
    h32 = xxhash.xxh32_intdigest
    return fold_shingles(np.fromiter((h32(w.encode()) for w in words), dtype=np.uint64, count=len(words)), ngram, bits)


def fold_shingles(hv: np.ndarray, ngram: int = DEFAULT_NGRAM, bits: int = 32) -> np.ndarray:
    """The n-gram hashes of a text from its words' xxh32 hashes (`hv`, uint64): see `shingle_hashes`."""
    n = min(ngram, len(hv))
    m = len(hv) - n + 1
    acc = np.full(m, 0xCBF29CE484222325, dtype=np.uint64)
    for j in range(n):  # FNV-style fold of the n word hashes at each position
        acc = (acc ^ hv[j : j + m]) * _FNV
    if bits == 64:
        return acc ^ (acc >> np.uint64(29))
    return (acc ^ (acc >> np.uint64(32))) & _M32


class Signer:
    """MinHash signatures with datasketch's permutations (shared, so each doc costs one numpy pass)."""

    def __init__(self, num_perm: int = DEFAULT_NUM_PERM, ngram: int = DEFAULT_NGRAM) -> None:
        self.num_perm = num_perm
        self.ngram = ngram
        self.permutations = MinHash(num_perm, seed=SEED, scheme=SCHEME).permutations

    def sign(self, text: str) -> np.ndarray:
        return self.sign_shingles(shingle_hashes(text, self.ngram))

    def sign_shingles(self, shingles: np.ndarray) -> np.ndarray:
        """The signature of a text's 32-bit shingle hashes (`shingle_hashes` / `fold_shingles`)."""
        m = MinHash(self.num_perm, seed=SEED, hashfunc=int, permutations=self.permutations, scheme=SCHEME)
        m.update_batch(shingles)
        return m.hashvalues

    def sign_many(self, texts: Iterable[str]) -> np.ndarray:
        texts = list(texts)
        out = np.empty((len(texts), self.num_perm), dtype=np.uint32)
        for i, t in enumerate(texts):
            out[i] = self.sign(t)
        return out


@dataclass(frozen=True)
class LshParams:
    bands: int
    rows: int

    def curve(self, jaccard: float) -> float:
        """Probability that two documents with this Jaccard share at least one band."""
        return 1.0 - (1.0 - jaccard**self.rows) ** self.bands


def lsh_params(threshold: float, num_perm: int, fp_weight: float = 0.1, fn_weight: float = 0.9) -> LshParams:
    """Bands x rows minimizing weighted false-positive/false-negative area around `threshold`.

    Recall is weighted 9:1 because candidates are verified afterwards (estimated Jaccard from the
    full signature >= threshold), which removes false positives but cannot recover misses.
    """
    from datasketch.lsh import _optimal_param

    b, r = _optimal_param(threshold, num_perm, fp_weight, fn_weight)
    return LshParams(int(b), int(r))


def band_hashes(sigs: np.ndarray, params: LshParams) -> np.ndarray:
    """(n, bands) uint64: one hash per band of each signature (FNV fold of the band's rows)."""
    n = sigs.shape[0]
    out = np.empty((n, params.bands), dtype=np.uint64)
    s = sigs.astype(np.uint64)
    for b in range(params.bands):
        acc = np.full(n, 0xCBF29CE484222325 ^ b, dtype=np.uint64)
        for j in range(b * params.rows, (b + 1) * params.rows):
            acc = (acc ^ s[:, j]) * _FNV
        out[:, b] = acc
    return out


def bucket_edges(hashes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Edges (first key of the bucket, other key) for every bucket of equal hashes with > 1 key.

    Grouping by sorting: O(n log n) and memory of two arrays, where a dict would hold objects.
    """
    if len(hashes) < 2:
        return np.empty((0, 2), dtype=np.uint64)
    order = np.lexsort((keys, hashes))
    h, k = hashes[order], keys[order]
    same = np.empty(len(h), dtype=bool)
    same[0] = False
    same[1:] = h[1:] == h[:-1]
    if not same.any():
        return np.empty((0, 2), dtype=np.uint64)
    starts = np.flatnonzero(~same)
    head = np.repeat(k[starts], np.diff(np.append(starts, len(h))))
    return np.stack([head[same], k[same]], axis=1)


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise fraction of equal MinHash values (the unbiased Jaccard estimate)."""
    return (a == b).mean(axis=1)


def components(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Connected components of an edge list: (sorted unique node keys, component label per node).

    Labels are 0..C-1, numbered by each component's smallest key. Min-label propagation with
    pointer jumping over numpy arrays: 16 bytes per node and per edge, where a dict-based
    union-find holds a few hundred bytes of Python objects per node.
    """
    nodes = np.unique(edges)
    if not len(nodes):
        return nodes, np.empty(0, dtype=np.int64)
    a = np.searchsorted(nodes, edges[:, 0])
    b = np.searchsorted(nodes, edges[:, 1])
    label = np.arange(len(nodes))
    while True:
        low = np.minimum(label[a], label[b])
        before = label.copy()
        np.minimum.at(label, a, low)
        np.minimum.at(label, b, low)
        while True:  # jump to the root: every node points at its label's label
            jumped = label[label]
            if np.array_equal(jumped, label):
                break
            label = jumped
        if np.array_equal(label, before):
            break
    _, dense = np.unique(label, return_inverse=True)
    return nodes, dense.astype(np.int64)


def normalized_words(text: str) -> str:
    """Lower-cased words of `text` joined by single spaces (punctuation and spacing do not count)."""
    return " ".join(_WORD.findall(text.lower()))


class NearDuplicateIndex:
    """Texts seen so far, for online near-duplicate checks of small sets (e.g. generated task instructions).

    A text is a near duplicate of a kept one when their normalized words are equal, or the MinHash
    estimate of the Jaccard similarity of their word n-grams reaches `threshold`. A linear scan of
    the kept signatures: meant for thousands of texts, not the corpus-scale dedup of `pipelines`.
    """

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, ngram: int = 3, num_perm: int = DEFAULT_NUM_PERM) -> None:
        self.threshold = threshold
        self.signer = Signer(num_perm, ngram)
        self._keys: list[str] = []
        self._texts: list[str] = []
        self._sigs: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, text: str, *, exclude: str | None = None) -> tuple[str, float] | None:
        """(key of the most similar kept text, similarity) when `text` near-duplicates one, else None."""
        norm = normalized_words(text)
        if not self._keys:
            return None
        sig = self.signer.sign(norm)
        sims = estimated_jaccard(np.stack(self._sigs), sig[None, :])
        best: tuple[str, float] | None = None
        for key, kept, sim in zip(self._keys, self._texts, sims.tolist()):
            sim = 1.0 if kept == norm else sim
            if key != exclude and sim >= self.threshold and (best is None or sim > best[1]):
                best = (key, round(sim, 3))
        return best

    def add(self, key: str, text: str) -> None:
        norm = normalized_words(text)
        self._keys.append(key)
        self._texts.append(norm)
        self._sigs.append(self.signer.sign(norm))

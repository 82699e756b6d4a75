"""Real pages recorded in a real world, and retrieval of those most like a simulated step.

UI-Simulator grounds its simulator in a small corpus of real experience of the target site: for
each simulated step it retrieves the recorded transition most like the current page and action
and gives the real page that followed to the simulator as the reference to write the next page
from. Here the corpus is a JSONL file of states, one object a line:

    {"id": "3f2a...", "url": "http://127.0.0.1:8000/product.html?sku=socks", "title": "Product - Tiny Shop",
     "axtree": "RootWebArea 'Product - Tiny Shop' ...", "screenshot": "screenshots/.../002.png",
     "action": {"function": "click", "arguments": {"bid": "16"}}, "action_text": "click link 'Red socks'",
     "from_url": "http://127.0.0.1:8000/", "from_title": "Tiny Shop", "source": "walk", "env": "browser",
     "task_id": "round-0000/explore"}

An entry page (the first page of an episode) has no action. `ui_simulator` writes such a file
when it explores a real world (`StateStore`); a dataset directory of trajectories made in one
(e.g. rollouts in the browser) is read as the same states.

Retrieval is lexical, BM25 (`rank_bm25.BM25Plus`) over the words of the page the step starts
on (the URL's path and query, the title), the action in words with its target element
(`click link 'Red socks'`) and the page it led to (URL and title): the words that decide what
page comes next are names on the page and in the URL, which lexical matching catches exactly and
which need no embedding model (none is reachable offline). BM25Plus rather than the classic Okapi
because Okapi's IDF goes negative for words most pages share ("html", the site's name), which
ranks longer pages down for matching them.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError
from rank_bm25 import BM25Plus

from envs.pages import describe_action, page_elements, page_title
from envs.tasks import resolve_path
from schemas.models import ApiAction, Step, WebObservation
from schemas.store import MANIFEST, Dataset

_TOKEN = re.compile(r"[a-z0-9]+")


class RealState(BaseModel):
    """A page of a real world, and the action (on the page before) that led to it."""

    model_config = ConfigDict(extra="ignore")

    id: str
    url: str
    title: str = ""
    axtree: str
    screenshot: str | None = None
    action: dict | None = None
    action_text: str | None = None
    from_url: str | None = None
    from_title: str | None = None
    source: str = ""
    env: str = ""
    task_id: str = ""


def _state_id(url: str, axtree: str, action: dict | None, from_url: str | None) -> str:
    key = json.dumps([url, axtree, action, from_url], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def states_from_steps(steps: Sequence[Step], *, source: str, env: str, task_id: str) -> list[RealState]:
    """The pages of an episode as states: its first page (an entry), then each page an action led to.

    An action the world refused (an error observation) or a message leads to no page and is skipped.
    """
    out: list[RealState] = []
    page: WebObservation | None = None
    action: ApiAction | None = None
    for step in steps:
        if isinstance(step, ApiAction):
            action = step
            continue
        if not isinstance(step, WebObservation):
            action = None
            continue
        if step.axtree and step.url:
            done = None if page is None or action is None else {"function": action.function,
                                                                "arguments": action.arguments}
            before = page if done is not None else None
            text = describe_action(action, page_elements(before.axtree)) if before is not None and action else None
            out.append(RealState(
                id=_state_id(step.url, step.axtree, done, before.url if before else None),
                url=step.url, title=page_title(step.axtree), axtree=step.axtree,
                screenshot=step.screenshot.path if step.screenshot is not None else None,
                action=done, action_text=text, from_url=before.url if before else None,
                from_title=page_title(before.axtree) if before else None, source=source, env=env, task_id=task_id))
        page, action = step, None
    return out


class StateStore:
    """A JSONL file of real states that only grows: a state already there (same id) is not written twice,
    so a resumed run that explores the same pages again adds nothing."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._ids: set[str] | None = None

    def append(self, states: Iterable[RealState]) -> int:
        """Write the states not in the file yet; how many were new."""
        if self._ids is None:
            self._ids = {s.id for s in _read_jsonl(self.path)} if self.path.exists() else set()
        new = []
        for state in states:
            if state.id not in self._ids:
                self._ids.add(state.id)
                new.append(state.model_dump_json())
        if new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write("\n".join(new) + "\n")  # one write: a reader never sees half a batch of lines
        return len(new)


def _read_jsonl(path: Path) -> list[RealState]:
    out = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(RealState.model_validate_json(line))
            except ValidationError as exc:
                problem = exc.errors()[0]
                where = ".".join(str(p) for p in problem["loc"])
                raise ValueError(f"{path}:{number}: not a real state ({where + ': ' if where else ''}{problem['msg']})") from None
    return out


def _read_dataset(path: Path) -> list[RealState]:
    out: list[RealState] = []
    for traj in Dataset.open(path).iter_records():
        info = traj.details.get("env")
        env = str(info.get("name", "")) if isinstance(info, dict) else ""
        out.extend(states_from_steps(traj.steps, source="dataset", env=env, task_id=traj.id))
    return out


def _tokens(text: str | None) -> list[str]:
    return _TOKEN.findall((text or "").lower())


def _url_tokens(url: str | None) -> list[str]:
    """The words of a URL that say which page it is: its path, query and fragment (not the host)."""
    if not url:
        return []
    parts = urlsplit(url)
    return _tokens(f"{parts.path} {parts.query} {parts.fragment}")


class RealStates:
    """Recorded real states, searchable by the step being simulated (indexes built on first use)."""

    def __init__(self, states: Sequence[RealState]) -> None:
        self.states = tuple(states)
        self.transitions = tuple(s for s in self.states if s.action_text)
        self.entries = tuple(s for s in self.states if not s.action_text)

    def __len__(self) -> int:
        return len(self.states)

    @cached_property
    def _transition_index(self) -> BM25Plus | None:
        return _bm25([_transition_words(s) for s in self.transitions])

    @cached_property
    def _entry_index(self) -> BM25Plus | None:
        return _bm25([_page_words(s) for s in self.entries])

    def similar(self, url: str | None, title: str, action_text: str, k: int) -> list[RealState]:
        """The `k` recorded transitions most like doing `action_text` on the page (`url`, `title`), best
        first, one per distinct page they led to."""
        query = [*_url_tokens(url), *_tokens(title), *_tokens(action_text)]
        out: list[RealState] = []
        for state in _rank(self.transitions, self._transition_index, query):
            if all((s.url, s.axtree) != (state.url, state.axtree) for s in out):
                out.append(state)
            if len(out) == k:
                break
        return out

    def at(self, url: str) -> RealState | None:
        """The first recorded entry page at `url`'s path and query (`/`, `contact.html`, or a full URL of the
        site), or None: a start URL names its page exactly, which word matching cannot do for `/`."""
        want = urlsplit(url.strip())
        key = ("/" + want.path.lstrip("/"), want.query)
        return next((s for s in self.entries
                     if ("/" + urlsplit(s.url).path.lstrip("/"), urlsplit(s.url).query) == key), None)

    def entry(self, query: str) -> RealState | None:
        """The recorded entry page most like `query` (a task's instruction and start URL)."""
        ranked = _rank(self.entries, self._entry_index, _tokens(query))
        return ranked[0] if ranked else None


def _transition_words(s: RealState) -> list[str]:
    return [*_url_tokens(s.from_url), *_tokens(s.from_title), *_tokens(s.action_text), *_url_tokens(s.url),
            *_tokens(s.title)]


def _page_words(s: RealState) -> list[str]:
    return [*_url_tokens(s.url), *_tokens(s.title), *_tokens(" ".join(e.name for e in page_elements(s.axtree)))]


def _bm25(documents: list[list[str]]) -> BM25Plus | None:
    # BM25 needs a non-empty token list per document.
    return BM25Plus([d or ["_"] for d in documents]) if documents else None


def _rank(states: Sequence[RealState], index: BM25Plus | None, query: list[str]) -> list[RealState]:
    """`states` by BM25 score for `query`, best first; ties keep the recorded order."""
    if index is None:
        return []
    scores = index.get_scores(query) if query else [0.0] * len(states)
    return [states[i] for i in sorted(range(len(states)), key=lambda i: (-scores[i], i))]


def load_real_states(paths: str | Path | Sequence[str | Path]) -> RealStates:
    """The states of JSONL files and dataset directories (deduplicated by id, in recorded order).

    Read once per process while the files are unchanged: every episode makes a new environment.
    """
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    keys = []
    for item in items:
        p = resolve_path(str(item))
        if not p.exists():
            raise ValueError(f"real_states: {item} does not exist (record real pages with ui_simulator in a real "
                             "world, e.g. env: browser, which writes real_states.jsonl into its output directory)")
        # A dataset directory changes when a shard is committed, which rewrites its manifest.
        manifest = p / MANIFEST
        stat = manifest.stat() if manifest.exists() else p.stat()
        keys.append((str(p.resolve()), stat.st_mtime_ns, stat.st_size))
    return _load(tuple(keys))


@lru_cache(maxsize=8)
def _load(keys: tuple[tuple[str, int, int], ...]) -> RealStates:
    seen: dict[str, RealState] = {}
    for path, _, _ in keys:
        p = Path(path)
        for state in _read_dataset(p) if p.is_dir() else _read_jsonl(p):
            seen.setdefault(state.id, state)
    return RealStates(list(seen.values()))

"""The state behind the viewer's API: its sources, their DuckDB store, and what each endpoint answers.

Every method returns plain data for one endpoint or raises ViewError (NotFound) with a one-line
message. Facets (`trajforge stats`) and export options (a pre-scan for trl-sft's layout) are
computed once per manifest version of a dataset and cached; facets start computing in the
background when the server starts.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import duckdb
import pyarrow as pa

from converters.export.render import Unrenderable
from schemas.arrow import pair_from_row, trajectory_from_row
from schemas.stats import dataset_stats
from schemas.store import StoreError
from viewer import preview
from viewer.loss_tokens import TOKEN_FORMATS, LossTokenError, loss_tokens
from viewer.queries import ListRequest, Store
from viewer.records import INVALID, pair_view, trajectory_view
from viewer.reports import (EPISODES_SQL, EVAL_REPORT, IMPROVE_REPORT, MAX_EPISODES, Report, eval_view, improve_view,
                            locations, plots, read_json)
from viewer.sources import Source, ViewError, first_line, unreadable


class NotFound(ViewError):
    pass


class Viewer:
    """The state behind the API: the sources, their DuckDB store, cached facets and export options."""

    def __init__(self, sources: list[Source], tokenizer: Path | None = None, reports: list[Report] | None = None) -> None:
        self.store = Store(sources)
        self.tokenizer = tokenizer
        self.report_list = reports or []
        self._cache: dict[tuple[Any, ...], Future[Any]] = {}
        self._lock = threading.Lock()

    def cached(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """`make()` once per key; keys carry the manifest version, so a dataset that grows is re-read. A
        caller asking while another computes the same key waits for that result (no second scan)."""
        with self._lock:
            future = self._cache.get(key)
            owner = future is None
            if owner:
                future = self._cache[key] = Future()
        if not owner:
            return future.result()
        try:
            future.set_result(make())
        except BaseException as exc:
            with self._lock:
                del self._cache[key]  # a failure is not kept: the next request tries again
            future.set_exception(exc)
        return future.result()

    def warm(self) -> threading.Thread:
        """Compute every dataset's facets in the background, from the start: the page asks for them
        with its first list, and a large dataset's first count of its shards takes seconds."""
        def run() -> None:
            # At the requests' own priority: below it (nice), a loaded machine starves it, and the page's
            # request for the facets waits on it all the same.
            for i, source in enumerate(self.store.sources):
                if source.kind == "dataset":
                    try:
                        self.facets(i)
                    except Exception:  # noqa: BLE001 - the request for them reports the error
                        pass

        thread = threading.Thread(target=run, name="trajforge-view-facets", daemon=True)
        thread.start()
        return thread

    # ---- sources and lists ----------------------------------------------------------------------

    def sources(self) -> list[dict[str, Any]]:
        out = []
        for i, source in enumerate(self.store.sources):
            entry: dict[str, Any] = {"index": i, "name": source.name, "path": str(source.path), "kind": source.kind,
                                     "format": source.format}
            if source.kind == "dataset":
                ds = source.dataset()
                try:
                    entry["counts"] = {t: ds.count(t) for t in ("trajectories", "pairs", "quarantine", "filtered")}
                    entry["stage"] = ds.manifest().get("stage")
                    entry["complete"] = ds.complete
                except StoreError as exc:
                    raise ViewError(str(exc)) from None
            out.append(entry)
        return out

    def facets(self, i: int) -> dict[str, Any]:
        source = self.store.source(i)
        if source.kind == "export":
            return {"records": None, "export": True}

        def make() -> dict[str, Any]:
            try:
                return dataset_stats(source.dataset())
            except StoreError as exc:
                raise ViewError(str(exc)) from None
            except (duckdb.Error, pa.ArrowException, OSError) as exc:  # the shards are read by both
                raise unreadable(source.path, exc) from None

        return self.cached(("facets", i, self.store.manifest_version(i)), make)

    def page(self, i: int, table: str, params: dict[str, str]) -> dict[str, Any]:
        return self.store.page(i, table, ListRequest.from_params(params))

    def count(self, i: int, table: str, params: dict[str, str]) -> dict[str, Any]:
        return {"total": self.store.count(i, table, ListRequest.from_params(params))}

    # ---- records --------------------------------------------------------------------------------

    def trajectory(self, i: int, record_id: str, table: str = "trajectories") -> dict[str, Any]:
        if table not in ("trajectories", "filtered"):
            raise ViewError(f"table must be trajectories or filtered, got {table!r}")
        rows = self.store.by_id(i, table, record_id)
        if not rows:
            raise NotFound(f"no {'trajectory' if table == 'trajectories' else 'filtered record'} {record_id!r} "
                           f"in {self.store.source(i).name}")
        view = trajectory_view(rows[0])
        view["pairs"] = self.store.pairs_with(i, record_id) if table == "trajectories" else []
        view["formats"] = preview.formats_for("trajectories")
        view["token_formats"] = list(TOKEN_FORMATS) if self.tokenizer else []
        return view

    def pair(self, i: int, pair_id: str) -> dict[str, Any]:
        rows = self.store.by_id(i, "pairs", pair_id)
        if not rows:
            raise NotFound(f"no pair {pair_id!r} in {self.store.source(i).name}")
        view = pair_view(rows[0])
        if "pair" not in view:
            return view
        p = view["pair"]
        for side in ("chosen", "rejected"):
            found = self.store.by_id(i, "trajectories", p[f"{side}_id"])
            view[side] = trajectory_view(found[0]) if found else None
        chosen, rejected = (view[side] and view[side].get("trajectory") for side in ("chosen", "rejected"))
        if chosen and rejected:
            k = p["prefix_len"]
            view["prefix_shared"] = len(chosen["steps"]) >= k and chosen["steps"][:k] == rejected["steps"][:k]
        view["formats"] = preview.formats_for("pairs")
        return view

    def quarantined(self, i: int, record_id: str) -> dict[str, Any]:
        rows = self.store.by_id(i, "quarantine", record_id, limit=20)
        if not rows:
            raise NotFound(f"no quarantined record {record_id!r} in {self.store.source(i).name}")
        return {"records": rows}

    def export_row(self, i: int, n: int) -> dict[str, Any]:
        row = self.store.export_row_at(i, n)
        if row is None:
            raise NotFound(f"no row {n} in {self.store.source(i).name}")
        return {"row": row, "format": self.store.source(i).format}

    def locate(self, record_id: str) -> dict[str, Any]:
        found = []
        for i, source in enumerate(self.store.sources):
            if source.kind == "dataset" and self.store.by_id(i, "trajectories", record_id):
                found.append(i)
        return {"id": record_id, "sources": found}

    # ---- eval and improve reports ---------------------------------------------------------------

    def reports(self) -> list[dict[str, Any]]:
        where = locations(self.report_list, self.store.sources)
        return [{"index": r, "name": rep.name, "path": str(rep.path), "kind": rep.kind,
                 "source": where.get(rep.path.resolve(), {}).get("source")} for r, rep in enumerate(self.report_list)]

    def report_at(self, r: int) -> Report:
        if not 0 <= r < len(self.report_list):
            raise NotFound(f"no report {r}; there are {len(self.report_list)}")
        return self.report_list[r]

    def report(self, r: int) -> dict[str, Any]:
        """An eval's or an improve run's page, read from the files its command wrote (re-read on each call:
        small files, and a run still going rewrites them)."""
        rep = self.report_at(r)
        where = locations(self.report_list, self.store.sources)
        head = {"index": r, "name": rep.name, "path": str(rep.path), "plots": plots(rep.path)}
        if rep.kind == "improve":
            return {**head, **improve_view(rep.path, read_json(rep.path / IMPROVE_REPORT), where)}
        source = where.get(rep.path.resolve(), {}).get("source")
        episodes: list[dict[str, Any]] = []
        relation = self.store.relation(source, "trajectories") if source is not None else None
        if relation is not None:
            episodes = self.store.rows(EPISODES_SQL.format(relation=relation, limit=MAX_EPISODES + 1))
        return {**head, **eval_view(read_json(rep.path / EVAL_REPORT), episodes, source)}

    # ---- export preview -------------------------------------------------------------------------

    def _options(self, i: int, name: str) -> Any:
        ds = self.store.source(i).dataset()
        return self.cached(("options", i, name, self.store.manifest_version(i)), lambda: preview.options_for(name, ds))

    def preview(self, i: int, name: str, params: dict[str, str]) -> dict[str, Any]:
        opts = self._options(i, name)
        if "pair" in params:
            rows = self.store.by_id(i, "pairs", params["pair"])
            if not rows:
                raise NotFound(f"no pair {params['pair']!r}")
            pair = _valid(pair_from_row, rows[0])
            chosen, rejected = (_trajectory_or_none(self.store, i, pid) for pid in (pair.chosen_id, pair.rejected_id))
            return preview.preview_pair(name, pair, chosen, rejected, opts)
        table = params.get("table", "trajectories")
        if table not in ("trajectories", "filtered"):
            raise ViewError(f"table must be trajectories or filtered, got {table!r}")
        rows = self.store.by_id(i, table, params.get("id", ""))
        if not rows:
            raise NotFound(f"no trajectory {params.get('id')!r}")
        traj = _valid(trajectory_from_row, rows[0])
        out = preview.preview_trajectory(name, traj, opts)
        if self.tokenizer and name in TOKEN_FORMATS and out["rows"]:
            try:
                out["tokens"] = loss_tokens(traj, name, self.tokenizer, opts)
            except (LossTokenError, Unrenderable) as exc:
                out["tokens_error"] = str(exc)
        return out


def _valid(from_row: Callable[[dict[str, Any]], Any], row: dict[str, Any]) -> Any:
    try:
        return from_row(row)
    except INVALID as exc:
        raise ViewError(f"record {row.get('id')!r} does not validate ({first_line(exc)})") from None


def _trajectory_or_none(store: Store, i: int, record_id: str) -> Any:
    rows = store.by_id(i, "trajectories", record_id)
    return _valid(trajectory_from_row, rows[0]) if rows else None

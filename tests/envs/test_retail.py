"""The retail environment: tools, validation, business rules, reward, simulated user, snapshots, determinism."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from envs.base import Task, said_to_user
from envs.retail.data import generate_world
from envs.retail.db import GOAL_TABLES
from envs.retail.env import RetailEnv
from envs.retail.tasks import generate_tasks
from schemas.models import ApiAction, CodeAction, MessageAction, TextObservation

SEED = 0


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def env() -> Iterator[RetailEnv]:
    e = RetailEnv(seed=SEED)
    yield e
    run(e.close())


def reward(env: RetailEnv) -> float:
    return run(env.evaluate()).reward


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return generate_tasks(14, seed=0, world_seed=SEED)


def _task(tasks: list[Task], kind: str) -> Task:
    return next(t for t in tasks if t.metadata["kind"] == kind)


def call(env: RetailEnv, function: str, **arguments: object):
    return run(env.step(ApiAction(function=function, arguments=arguments)))


def _hash(env: RetailEnv) -> str:
    return env.db.state_hash(GOAL_TABLES)


def _order(env: RetailEnv, status: str) -> dict:
    return env.db.one("SELECT * FROM orders WHERE status = ? ORDER BY order_id", [status])


# --- tools and validation ------------------------------------------------------------------------
def test_tools_have_valid_json_schemas(env: RetailEnv) -> None:
    tools = env.tools()
    assert 8 <= len(tools) <= 15
    assert len({t.name for t in tools}) == len(tools)
    for t in tools:
        Draft202012Validator.check_schema(t.parameters)
        assert t.parameters["type"] == "object" and t.description


def test_lookup_tools_return_data(env: RetailEnv, tasks: list[Task]) -> None:
    run(env.reset(tasks[0]))
    user = env.db.one("SELECT * FROM users ORDER BY user_id")
    r = call(env, "find_user_id_by_email", email=user["email"].upper())
    assert r.observation.content == user["user_id"] and not r.info
    r = call(env, "find_user_id_by_name_zip", first_name=user["first_name"], last_name=user["last_name"], zip=user["zip"])
    assert r.observation.content == user["user_id"]
    details = json.loads(call(env, "get_user_details", user_id=user["user_id"]).observation.content)
    assert details["email"] == user["email"] and details["orders"] and details["payment_methods"]
    order = json.loads(call(env, "get_order_details", order_id=details["orders"][0]).observation.content)
    assert order["user_id"] == user["user_id"] and order["items"]
    listed = json.loads(call(env, "list_user_orders", user_id=user["user_id"]).observation.content)
    assert [o["order_id"] for o in listed] == details["orders"]
    product = json.loads(call(env, "get_product_details", product_id=order["items"][0]["product_id"]).observation.content)
    assert order["items"][0]["item_id"] in product["variants"]
    found = json.loads(call(env, "search_products", query=product["name"].split()[-1]).observation.content)
    assert product["product_id"] in {p["product_id"] for p in found}
    r = call(env, "find_user_id_by_email", email="nobody@nowhere.org")
    assert r.info["error"] == "user not found" and r.observation.content.startswith("Error:")


@pytest.mark.parametrize(
    ("function", "arguments", "expected"),
    [
        ("delete_everything", {}, "unknown tool 'delete_everything'"),
        ("find_user_id_by_email", {}, "missing required argument 'email'"),
        ("find_user_id_by_email", {"email": "a@b.c", "foo": 1}, "unexpected argument 'foo'"),
        ("get_order_details", {"order_id": 123}, "argument 'order_id' must be of type string, got integer"),
        ("cancel_pending_order", {"order_id": "#W1", "reason": "bored"}, "argument 'reason' must be one of"),
        ("return_delivered_order_items", {"order_id": "#W1", "item_ids": "x", "payment_method_id": "p"},
         "argument 'item_ids' must be of type array, got string"),
    ],
)
def test_invalid_calls_are_refused_with_reason(env: RetailEnv, tasks: list[Task], function: str, arguments: dict,
                                               expected: str) -> None:
    run(env.reset(tasks[0]))
    before = _hash(env)
    r = run(env.step(ApiAction(function=function, arguments=arguments)))
    assert expected in r.info["error"]
    assert isinstance(r.observation, TextObservation) and r.observation.content.startswith("Error:")
    assert expected in r.observation.content and not r.done
    assert _hash(env) == before


def test_business_rules_refuse_and_leave_state_unchanged(env: RetailEnv, tasks: list[Task]) -> None:
    run(env.reset(tasks[0]))
    before = _hash(env)
    delivered, pending = _order(env, "delivered"), _order(env, "pending")
    r = call(env, "cancel_pending_order", order_id=delivered["order_id"], reason="no longer needed")
    assert "only pending orders can be cancelled" in r.info["error"] and r.info["rule_violation"]
    item = env.db.one("SELECT item_id FROM order_items WHERE order_id = ?", [pending["order_id"]])["item_id"]
    r = call(env, "return_delivered_order_items", order_id=pending["order_id"], item_ids=[item],
             payment_method_id=pending["payment_method_id"])
    assert "only delivered orders can be returned" in r.info["error"]
    r = call(env, "cancel_pending_order", order_id="#W0000000", reason="no longer needed")
    assert "not found" in r.info["error"]
    other = env.db.one("SELECT payment_method_id FROM payment_methods WHERE user_id <> ? ORDER BY 1", [pending["user_id"]])
    r = call(env, "modify_pending_order_items", order_id=pending["order_id"], item_ids=[item], new_item_ids=[item],
             payment_method_id=other["payment_method_id"])
    assert "same as the old item" in r.info["error"] or "not found for user" in r.info["error"]
    foreign = env.db.one("SELECT item_id FROM variants WHERE product_id <> (SELECT product_id FROM variants WHERE item_id = ?) "
                         "ORDER BY item_id", [item])["item_id"]
    r = call(env, "modify_pending_order_items", order_id=pending["order_id"], item_ids=[item], new_item_ids=[foreign],
             payment_method_id=pending["payment_method_id"])
    assert "not a variant of the same product" in r.info["error"]
    r = call(env, "return_delivered_order_items", order_id=delivered["order_id"], item_ids=["0000000000"],
             payment_method_id=delivered["payment_method_id"])
    assert "is not in order" in r.info["error"]
    assert _hash(env) == before


def test_cancel_changes_status_and_refunds(env: RetailEnv, tasks: list[Task]) -> None:
    run(env.reset(tasks[0]))
    pending = _order(env, "pending")
    r = call(env, "cancel_pending_order", order_id=pending["order_id"], reason="ordered by mistake")
    assert not r.info
    out = json.loads(r.observation.content)
    assert out["status"] == "cancelled" and out["cancel_reason"] == "ordered by mistake"
    assert out["payment_history"][-1]["kind"] == "refund"
    assert out["payment_history"][-1]["amount"] == out["total"]
    # A second cancel is now a rule violation.
    assert "only pending" in call(env, "cancel_pending_order", order_id=pending["order_id"], reason="no longer needed").info["error"]


def test_gift_card_refund_increases_balance(env: RetailEnv, tasks: list[Task]) -> None:
    run(env.reset(tasks[0]))
    row = env.db.one("SELECT o.order_id, p.payment_method_id, p.balance_cents FROM orders o JOIN payment_methods p "
                     "USING (payment_method_id) WHERE o.status = 'pending' AND p.source = 'gift_card' ORDER BY 1")
    if row is None:
        pytest.skip("no pending gift-card order in this world")
    total = env.db.one("SELECT SUM(price_cents) AS t FROM order_items WHERE order_id = ?", [row["order_id"]])["t"]
    call(env, "cancel_pending_order", order_id=row["order_id"], reason="no longer needed")
    after = env.db.one("SELECT balance_cents FROM payment_methods WHERE payment_method_id = ?", [row["payment_method_id"]])
    assert after["balance_cents"] == row["balance_cents"] + total


# --- reward --------------------------------------------------------------------------------------
def _finish(env: RetailEnv, task: Task, text: str = ""):
    return run(env.step(MessageAction(content=f"{text} Is there anything else I can help you with?")))


@pytest.mark.parametrize("kind", ["cancel", "modify_address", "modify_items", "return", "exchange", "user_address",
                                  "order_total"])
def test_reference_actions_earn_reward_one(env: RetailEnv, tasks: list[Task], kind: str) -> None:
    task = _task(tasks, kind)
    (obs,) = run(env.reset(task))
    assert obs.source == "user" and obs.content == task.instruction
    for a in task.goal["actions"]:
        r = run(env.step(ApiAction(**a)))
        assert not r.info and not r.done
    said = f"Your order is {task.goal['outputs'][1]} and its total is ${task.goal['outputs'][0]}." if task.goal["outputs"] else "Done."
    r = _finish(env, task, said)
    assert r.done and reward(env) == 1.0 and run(env.evaluate()).success


def test_wrong_actions_earn_zero(env: RetailEnv, tasks: list[Task]) -> None:
    task = _task(tasks, "cancel")
    run(env.reset(task))
    wrong = dict(task.goal["actions"][-1]["arguments"])
    wrong["reason"] = next(r for r in ("no longer needed", "ordered by mistake") if r != wrong["reason"])
    assert not call(env, "cancel_pending_order", **wrong).info
    r = _finish(env, task, "Cancelled.")
    assert r.done and reward(env) == 0.0


def test_doing_nothing_earns_zero_and_info_task_needs_the_answer(env: RetailEnv, tasks: list[Task]) -> None:
    run(env.reset(_task(tasks, "cancel")))
    _finish(env, tasks[0], "Done.")
    assert reward(env) == 0.0
    task = _task(tasks, "order_total")
    run(env.reset(task))
    for a in task.goal["actions"]:
        run(env.step(ApiAction(**a)))
    r = _finish(env, task, "I looked it up.")
    assert r.done and reward(env) == 0.0


def test_transfer_ends_episode_and_max_steps_truncates(tasks: list[Task]) -> None:
    env = RetailEnv(seed=SEED, max_steps=3)
    run(env.reset(tasks[0]))
    r = call(env, "transfer_to_human_agents", summary="user wants a human")
    assert r.done and r.observation.content == "Transfer successful" and reward(env) == 0.0
    assert "episode is over" in call(env, "think", thought="x").info["error"]
    run(env.reset(tasks[0]))
    call(env, "think", thought="a")
    call(env, "think", thought="b")
    r = call(env, "think", thought="c")
    assert r.done and r.info["truncated"]


def test_code_actions_are_refused(env: RetailEnv, tasks: list[Task]) -> None:
    run(env.reset(tasks[0]))
    r = run(env.step(CodeAction(language="python", content="print(1)")))
    assert "code actions are not supported" in r.info["error"] and not r.done


# --- simulated user ------------------------------------------------------------------------------
def test_simulated_user_answers_from_hidden_info(env: RetailEnv, tasks: list[Task]) -> None:
    task = _task(tasks, "cancel")
    info = task.metadata["user_info"]
    run(env.reset(task))
    r = run(env.step(MessageAction(content="Could you give me your email address?")))
    assert info["email"] in r.observation.content and r.observation.source == "user" and not r.done
    r = run(env.step(MessageAction(content="Which order id, and what is the reason?")))
    assert info["order_id"] in r.observation.content and info["reason"] in r.observation.content
    r = run(env.step(MessageAction(content="Please confirm (yes/no) that I should proceed.")))
    assert "Yes" in r.observation.content
    r = run(env.step(MessageAction(content="Hmm.")))
    assert task.instruction in r.observation.content
    r = run(env.step(MessageAction(content="Your order has been cancelled. Anything else?")))
    assert r.done and "###STOP###" in r.observation.content


# --- snapshot / restore --------------------------------------------------------------------------
def test_snapshot_restore_branches(env: RetailEnv, tasks: list[Task]) -> None:
    task = _task(tasks, "cancel")
    run(env.reset(task))
    order_id = task.goal["actions"][-1]["arguments"]["order_id"]
    root, root_hash = env.snapshot(), _hash(env)

    call(env, "cancel_pending_order", order_id=order_id, reason="no longer needed")
    run(env.step(MessageAction(content="Working on it.")))
    branch_a, hash_a = env.snapshot(), _hash(env)
    assert hash_a != root_hash

    env.restore(root)
    assert _hash(env) == root_hash and env.db.one("SELECT status FROM orders WHERE order_id = ?", [order_id])["status"] == "pending"
    call(env, "modify_pending_order_address", order_id=order_id, address1="1 New St", address2="", city="Austin",
         state="TX", country="USA", zip="73301")
    hash_b = _hash(env)
    assert hash_b not in (root_hash, hash_a)

    env.restore(branch_a)
    assert _hash(env) == hash_a and said_to_user(env.history) == "Working on it." and len(env.history) == 5
    env.restore(root)
    env.restore(root)  # restoring twice from one snapshot gives the same state
    assert _hash(env) == root_hash and len(env.history) == 1
    # Finishing the right branch earns the reward; the snapshot is still reusable afterwards.
    env.restore(root)
    for a in task.goal["actions"]:
        run(env.step(ApiAction(**a)))
    _finish(env, task)
    assert reward(env) == 1.0
    env.restore(branch_a)
    assert not env.done and _hash(env) == hash_a


def test_snapshots_survive_refused_calls_and_copies_are_freed(env: RetailEnv, tasks: list[Task]) -> None:
    run(env.reset(tasks[0]))
    pending = _order(env, "pending")
    root = env.snapshot()
    for _ in range(30):
        call(env, "cancel_pending_order", order_id=pending["order_id"], reason="no longer needed")
        env.snapshot()  # dropped at once: nothing of it may stay in the database
        env.restore(root)
    env.snapshot()
    n_tables = len(env.db.rows("SELECT name FROM sqlite_master WHERE type = 'table'"))
    assert n_tables == 7 and _order(env, "pending")["order_id"] == pending["order_id"]


def test_snapshot_restore_is_fast(env: RetailEnv, tasks: list[Task]) -> None:
    task = _task(tasks, "cancel")
    run(env.reset(task))
    root = env.snapshot()
    cancel = ApiAction(**task.goal["actions"][-1])
    snaps, restores = [], []
    for _ in range(30):
        run(env.step(cancel))
        t0 = time.perf_counter()
        env.snapshot()
        t1 = time.perf_counter()
        env.restore(root)
        snaps.append(t1 - t0)
        restores.append(time.perf_counter() - t1)
    # Target < 5 ms each on a quiet machine; the bound is loose for shared CI runners.
    assert statistics.median(snaps) < 0.02 and statistics.median(restores) < 0.02


# --- determinism ---------------------------------------------------------------------------------
def test_same_seed_same_world_and_tasks() -> None:
    assert generate_world(7) == generate_world(7)
    assert generate_world(7) != generate_world(8)
    a, b = generate_tasks(7, seed=1, world_seed=7), generate_tasks(7, seed=1, world_seed=7)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert [t.instruction for t in generate_tasks(7, seed=2, world_seed=7)] != [t.instruction for t in a]
    e1, e2 = RetailEnv(seed=7), RetailEnv(seed=7)
    assert e1.state() == e2.state() and _hash(e1) == _hash(e2)
    assert len(e1.state()["users"]) == 20 and len(e1.state()["orders"]) == 40


def test_generated_tasks_are_distinct() -> None:
    # Seed 0 draws the same return task twice within its first 40 drafts; the repeat is skipped.
    tasks = generate_tasks(40, seed=0)
    assert len(tasks) == 40 and len({t.instruction for t in tasks}) == 40
    assert [t.id for t in tasks] == [f"retail-w0-s0-{i:04d}" for i in range(40)]


def test_task_world_seed_overrides_env_seed(tasks: list[Task]) -> None:
    env = RetailEnv(seed=5)
    task = _task(tasks, "cancel")  # made for world 0
    run(env.reset(task))
    for a in task.goal["actions"]:
        assert not run(env.step(ApiAction(**a))).info
    _finish(env, task)
    assert reward(env) == 1.0

"""Deterministic retail task generation: an instruction, hidden user info, reference actions and the goal state hash."""

from __future__ import annotations

import json
import random
from typing import Any, Callable

from envs.base import Task
from envs.retail.data import CITIES, STREETS, Rows, generate_world
from envs.retail.db import GOAL_TABLES, RetailDB, initial_snapshot
from envs.retail.tools import ADDRESS_FIELDS, CANCEL_REASONS, call_tool

Draft = dict[str, Any]  # instruction, user_info, actions, outputs


def _call(function: str, **arguments: Any) -> dict[str, Any]:
    return {"function": function, "arguments": arguments}


class _World:
    """Indexes over a world's rows that the scenario builders share."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        self.users = {u["user_id"]: u for u in rows["users"]}
        self.products = {p["product_id"]: p for p in rows["products"]}
        self.variants = {v["item_id"]: v for v in rows["variants"]}
        self.lines: dict[str, list[dict[str, Any]]] = {}
        for line in rows["order_items"]:
            self.lines.setdefault(line["order_id"], []).append(line)
        self.methods: dict[str, list[dict[str, Any]]] = {}
        for m in rows["payment_methods"]:
            self.methods.setdefault(m["user_id"], []).append(m)

    def orders(self, status: str) -> list[dict[str, Any]]:
        return [o for o in self.rows["orders"] if o["status"] == status]

    def alternatives(self, line: dict[str, Any]) -> list[dict[str, Any]]:
        return [v for v in self.rows["variants"]
                if v["product_id"] == line["product_id"] and v["item_id"] != line["item_id"] and v["stock"] > 0]

    def credit_card(self, user_id: str) -> dict[str, Any]:
        return next(m for m in self.methods[user_id] if m["source"] == "credit_card")

    def describe(self, item_id: str) -> str:
        v = self.variants[item_id]
        opts = ", ".join(f"{k} {val}" for k, val in json.loads(v["options"]).items())
        return f"{self.products[v['product_id']]['name']} ({opts})"


def _identify(rng: random.Random, user: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """How the user identifies themself: by email or by name + zip (half each)."""
    if rng.random() < 0.5:
        return f"My email is {user['email']}.", _call("find_user_id_by_email", email=user["email"])
    return (f"I'm {user['first_name']} {user['last_name']}, zip code {user['zip']}.",
            _call("find_user_id_by_name_zip", first_name=user["first_name"], last_name=user["last_name"], zip=user["zip"]))


def _user_info(user: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"email": user["email"], "first_name": user["first_name"], "last_name": user["last_name"], "zip": user["zip"], **extra}


def _cancel(rng: random.Random, w: _World) -> Draft | None:
    orders = w.orders("pending")
    if not orders:
        return None
    order = rng.choice(orders)
    user = w.users[order["user_id"]]
    reason = rng.choice(CANCEL_REASONS)
    ident, find = _identify(rng, user)
    why = "I no longer need it" if reason == "no longer needed" else "I ordered it by mistake"
    return {
        "instruction": f"Please cancel my pending order {order['order_id']} because {why}. {ident}",
        "user_info": _user_info(user, order_id=order["order_id"], reason=reason),
        "actions": [find, _call("get_order_details", order_id=order["order_id"]),
                    _call("cancel_pending_order", order_id=order["order_id"], reason=reason)],
        "outputs": [],
    }


def _new_address(rng: random.Random) -> dict[str, str]:
    city, state = rng.choice(CITIES)
    return dict(zip(ADDRESS_FIELDS, [f"{rng.randint(10, 9999)} {rng.choice(STREETS)}", "", city, state, "USA",
                                     f"{rng.randint(10000, 99999)}"]))


def _address_text(a: dict[str, str]) -> str:
    return ", ".join(a[f] for f in ADDRESS_FIELDS if a[f])


def _modify_address(rng: random.Random, w: _World) -> Draft | None:
    orders = w.orders("pending")
    if not orders:
        return None
    order = rng.choice(orders)
    user = w.users[order["user_id"]]
    address = _new_address(rng)
    ident, find = _identify(rng, user)
    return {
        "instruction": f"I need to change the shipping address of my pending order {order['order_id']} to "
                       f"{_address_text(address)}. {ident}",
        "user_info": _user_info(user, order_id=order["order_id"], address=_address_text(address)),
        "actions": [find, _call("get_order_details", order_id=order["order_id"]),
                    _call("modify_pending_order_address", order_id=order["order_id"], **address)],
        "outputs": [],
    }


def _swap_line(rng: random.Random, w: _World, status: str) -> tuple[dict, dict, dict] | None:
    candidates = [(o, ln) for o in w.orders(status) for ln in w.lines[o["order_id"]] if w.alternatives(ln)]
    if not candidates:
        return None
    order, line = rng.choice(candidates)
    return order, line, rng.choice(w.alternatives(line))


def _modify_items(rng: random.Random, w: _World) -> Draft | None:
    picked = _swap_line(rng, w, "pending")
    if picked is None:
        return None
    order, line, new = picked
    user = w.users[order["user_id"]]
    card = w.credit_card(user["user_id"])
    ident, find = _identify(rng, user)
    return {
        "instruction": f"In my pending order {order['order_id']} I'd like to change the {w.describe(line['item_id'])} "
                       f"to the {w.describe(new['item_id'])}. Charge or refund any difference on my credit card "
                       f"{card['payment_method_id']}. {ident}",
        "user_info": _user_info(user, order_id=order["order_id"], payment_method_id=card["payment_method_id"],
                                item=w.describe(line["item_id"]), new_item=w.describe(new["item_id"])),
        "actions": [find, _call("get_order_details", order_id=order["order_id"]),
                    _call("get_product_details", product_id=line["product_id"]),
                    _call("modify_pending_order_items", order_id=order["order_id"], item_ids=[line["item_id"]],
                          new_item_ids=[new["item_id"]], payment_method_id=card["payment_method_id"])],
        "outputs": [],
    }


def _exchange(rng: random.Random, w: _World) -> Draft | None:
    picked = _swap_line(rng, w, "delivered")
    if picked is None:
        return None
    order, line, new = picked
    user = w.users[order["user_id"]]
    card = w.credit_card(user["user_id"])
    ident, find = _identify(rng, user)
    return {
        "instruction": f"I received order {order['order_id']} and want to exchange the {w.describe(line['item_id'])} "
                       f"for the {w.describe(new['item_id'])}. Use my credit card {card['payment_method_id']} for any "
                       f"price difference. {ident}",
        "user_info": _user_info(user, order_id=order["order_id"], payment_method_id=card["payment_method_id"],
                                item=w.describe(line["item_id"]), new_item=w.describe(new["item_id"])),
        "actions": [find, _call("get_order_details", order_id=order["order_id"]),
                    _call("get_product_details", product_id=line["product_id"]),
                    _call("exchange_delivered_order_items", order_id=order["order_id"], item_ids=[line["item_id"]],
                          new_item_ids=[new["item_id"]], payment_method_id=card["payment_method_id"])],
        "outputs": [],
    }


def _return(rng: random.Random, w: _World) -> Draft | None:
    orders = w.orders("delivered")
    if not orders:
        return None
    order = rng.choice(orders)
    user = w.users[order["user_id"]]
    lines = rng.sample(w.lines[order["order_id"]], k=rng.randint(1, len(w.lines[order["order_id"]])))
    lines.sort(key=lambda ln: ln["line_no"])
    ident, find = _identify(rng, user)
    names = " and the ".join(w.describe(ln["item_id"]) for ln in lines)
    return {
        "instruction": f"I want to return the {names} from my delivered order {order['order_id']}, refunded to the "
                       f"original payment method. {ident}",
        "user_info": _user_info(user, order_id=order["order_id"], payment_method_id=order["payment_method_id"], item=names),
        "actions": [find, _call("get_order_details", order_id=order["order_id"]),
                    _call("return_delivered_order_items", order_id=order["order_id"],
                          item_ids=[ln["item_id"] for ln in lines], payment_method_id=order["payment_method_id"])],
        "outputs": [],
    }


def _user_address(rng: random.Random, w: _World) -> Draft | None:
    user = rng.choice(w.rows["users"])
    address = _new_address(rng)
    ident, find = _identify(rng, user)
    return {
        "instruction": f"I moved. Please update my default address to {_address_text(address)}. {ident}",
        "user_info": _user_info(user, address=_address_text(address)),
        "actions": [find, _call("modify_user_address", user_id=user["user_id"], **address)],
        "outputs": [],
    }


def _order_total(rng: random.Random, w: _World) -> Draft | None:
    order = rng.choice(w.rows["orders"])
    user = w.users[order["user_id"]]
    total = sum(ln["price_cents"] for ln in w.lines[order["order_id"]]) / 100
    ident, find = _identify(rng, user)
    return {
        "instruction": f"What is the status and the total of my order {order['order_id']}? {ident}",
        "user_info": _user_info(user, order_id=order["order_id"]),
        "actions": [find, _call("get_order_details", order_id=order["order_id"])],
        # The agent must tell the user both; no state change is expected.
        "outputs": [f"{total:.2f}", order["status"]],
    }


SCENARIOS: dict[str, Callable[[random.Random, _World], Draft | None]] = {
    "cancel": _cancel, "modify_address": _modify_address, "modify_items": _modify_items,
    "return": _return, "exchange": _exchange, "user_address": _user_address, "order_total": _order_total,
}


def goal_hash(world_seed: int, actions: list[dict[str, Any]], db: RetailDB | None = None) -> str:
    """The state hash after applying `actions` to the initial world of `world_seed`."""
    own = db is None
    db = db or RetailDB(initial_snapshot(world_seed))
    try:
        db.restore(initial_snapshot(world_seed))
        for a in actions:
            call_tool(db, a["function"], a["arguments"])
        return db.state_hash(GOAL_TABLES)
    finally:
        if own:
            db.close()


def generate_tasks(n: int, seed: int = 0, world_seed: int = 0, kinds: list[str] | None = None) -> list[Task]:
    """`n` distinct tasks over the world of `world_seed`, cycling through scenario kinds; deterministic in
    (seed, world_seed). Fewer when the world cannot offer `n` different ones."""
    rng = random.Random(f"retail-tasks-{world_seed}-{seed}")
    world = _World(generate_world(world_seed))
    kinds = kinds or list(SCENARIOS)
    db = RetailDB(initial_snapshot(world_seed))
    tasks: list[Task] = []
    seen: set[str] = set()  # a repeated task would only repeat the same episode
    try:
        attempts = 0
        while len(tasks) < n and attempts < 10 * n + 10:
            kind = kinds[attempts % len(kinds)]
            attempts += 1
            draft = SCENARIOS[kind](rng, world)
            if draft is None or draft["instruction"] in seen:
                continue
            seen.add(draft["instruction"])
            i = len(tasks)
            tasks.append(Task(
                id=f"retail-w{world_seed}-s{seed}-{i:04d}", env="retail", instruction=draft["instruction"],
                params={"world_seed": world_seed}, seed=seed,
                goal={"actions": draft["actions"], "outputs": draft["outputs"],
                      "state_hash": goal_hash(world_seed, draft["actions"], db)},
                metadata={"kind": kind, "user_info": draft["user_info"]},
            ))
    finally:
        db.close()
    return tasks

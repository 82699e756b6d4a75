"""Deterministic web-shop tasks (buy under a price, look up a price, fill the cart) and their goal checks."""

from __future__ import annotations

import random
import re
from typing import Any, Callable

from envs.base import Task
from envs.web.catalog import Product, generate_catalog
from envs.web.site import BrowserState

NAMES = ["Ana Lopez", "Ben Okafor", "Chen Wei", "Dana Kim", "Eli Rossi", "Fay Patel"]
STREETS = ["12 Oak St", "7 Pine Rd", "301 Lake Dr", "88 Elm St"]
CITIES = ["Austin", "Denver", "Boston", "Seattle"]


def _shipping(rng: random.Random) -> dict[str, str]:
    return {"name": rng.choice(NAMES), "address": rng.choice(STREETS), "city": rng.choice(CITIES),
            "zip": f"{rng.randint(10000, 99999)}"}


def _purchase(rng: random.Random, catalog: tuple[Product, ...]) -> tuple[str, dict[str, Any]] | None:
    for _ in range(20):
        p = rng.choice(catalog)
        limit = p.price_cents // 100 + 1
        matches = [q for q in catalog if q.color == p.color and q.noun == p.noun and q.price_cents < limit * 100]
        if matches != [p]:
            continue  # the description must pick out exactly one product
        qty = rng.choice([1, 1, 2])
        ship = _shipping(rng)
        what = f"a {p.color} {p.noun} that costs" if qty == 1 else f"{qty} {p.color} {p.noun}s that cost"
        instruction = (f"Buy {what} less than ${limit}{'' if qty == 1 else ' each'} and check out. Ship to "
                       f"{ship['name']}, {ship['address']}, {ship['city']}, {ship['zip']}.")
        return instruction, {"type": "purchase", "items": {p.product_id: qty}, "shipping": ship}
    return None


def _answer(rng: random.Random, catalog: tuple[Product, ...]) -> tuple[str, dict[str, Any]] | None:
    p = rng.choice(catalog)
    return (f"Find the price of the {p.name} and tell me what it is.",
            {"type": "answer", "must_contain": [f"{p.price_cents / 100:.2f}"], "product_id": p.product_id})


def _cart(rng: random.Random, catalog: tuple[Product, ...]) -> tuple[str, dict[str, Any]] | None:
    a, b = rng.sample(catalog, 2)
    qa = rng.randint(1, 3)
    return (f"Add {qa} x {a.name} and 1 x {b.name} to my cart, but do not check out. Tell me when you are done.",
            {"type": "cart", "items": {a.product_id: qa, b.product_id: 1}})


KINDS: dict[str, Callable[[random.Random, tuple[Product, ...]], tuple[str, dict[str, Any]] | None]] = {
    "purchase": _purchase, "answer": _answer, "cart": _cart,
}


def generate_tasks(n: int, seed: int = 0, catalog_seed: int = 0, kinds: list[str] | None = None) -> list[Task]:
    rng = random.Random(f"web-tasks-{catalog_seed}-{seed}")
    catalog = generate_catalog(catalog_seed)
    kinds = kinds or list(KINDS)
    tasks: list[Task] = []
    attempt = 0
    while len(tasks) < n and attempt < 10 * n + 10:
        kind = kinds[attempt % len(kinds)]
        attempt += 1
        made = KINDS[kind](rng, catalog)
        if made is None:
            continue
        instruction, goal = made
        tasks.append(Task(id=f"web-c{catalog_seed}-s{seed}-{len(tasks):04d}", env="web", instruction=instruction,
                          params={"catalog_seed": catalog_seed}, goal=goal, seed=seed, metadata={"kind": kind}))
    return tasks


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower().replace("$", "").replace(",", "")).strip()


def check_goal(goal: dict[str, Any], state: BrowserState, answer: str | None) -> float:
    """1.0 when the state (and the final answer) satisfy the goal, else 0.0."""
    kind = goal.get("type")
    if kind == "purchase":
        ship = {k: _norm(v) for k, v in goal["shipping"].items()}
        ok = any(o.items == goal["items"] and {k: _norm(v) for k, v in o.shipping.items()} == ship for o in state.orders)
        return 1.0 if ok else 0.0
    if kind == "answer":
        said = _norm(answer or "")
        return 1.0 if all(_norm(x) in said for x in goal["must_contain"]) else 0.0
    if kind == "cart":
        return 1.0 if state.cart == goal["items"] else 0.0
    return 0.0

"""The web shop: pages and browser actions, validation, goal checks, snapshots, determinism."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from envs.base import Task
from envs.web.catalog import generate_catalog
from envs.web.env import WebShopEnv
from envs.web.site import VIEWPORT
from envs.web.solver import reference_actions
from envs.web.tasks import generate_tasks
from schemas.models import ApiAction, CodeAction, MessageAction, WebObservation


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return generate_tasks(9, seed=0, catalog_seed=0)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def reward(env: WebShopEnv) -> float:
    return run(env.evaluate()).reward


@pytest.fixture
def env(tasks: list[Task]) -> WebShopEnv:
    e = WebShopEnv(seed=0)
    run(e.reset(tasks[0]))
    return e


def act(env: WebShopEnv, function: str, **arguments: object):
    return run(env.step(ApiAction(function=function, arguments=arguments)))


def elements(obs: WebObservation) -> list[dict]:
    return json.loads(obs.axtree)["elements"]


def bid(obs: WebObservation, name: str) -> str:
    return next(e["bid"] for e in elements(obs) if e["name"] == name or e["name"].startswith(name))


def test_tools_have_valid_json_schemas(env: WebShopEnv) -> None:
    tools = env.tools()
    assert [t.name for t in tools] == ["click", "type", "scroll", "go_back", "goto"]
    for t in tools:
        Draft202012Validator.check_schema(t.parameters)


def test_reset_shows_home_page_with_element_list(tasks: list[Task]) -> None:
    env = WebShopEnv(seed=0)
    request, obs = run(env.reset(tasks[0]))
    assert isinstance(obs, WebObservation) and obs.url == "http://shop.local/"
    assert request.source == "user" and request.content == tasks[0].instruction
    tree = json.loads(obs.axtree)
    assert tree["title"] == "Shop - Home" and "<html>" in obs.html
    for el in tree["elements"]:
        assert {"bid", "role", "name", "clickable"} <= set(el)
    assert any(el["role"] == "textbox" and el["value"] == "" for el in tree["elements"])


def test_navigation_search_cart_and_back(env: WebShopEnv) -> None:
    product = env.site.catalog[0]
    obs = act(env, "type", bid=bid(env.observe(), "Search products"), text=product.noun, press_enter=True).observation
    assert obs.url.startswith("http://shop.local/search?q=")
    obs = act(env, "click", bid=bid(obs, product.name)).observation
    assert obs.url.endswith(f"/product/{product.product_id}")
    assert any(e["name"] == f"Price: {product.price}" for e in elements(obs))
    act(env, "type", bid=bid(obs, "Quantity"), text="2")
    obs = act(env, "click", bid=bid(env.observe(), "Add to cart")).observation
    assert any(e["name"] == "Cart (2)" for e in elements(obs)) and env.browser.cart == {product.product_id: 2}
    obs = act(env, "go_back").observation
    assert "search?q=" in obs.url
    obs = act(env, "goto", url="/cart").observation
    assert any(e["name"].startswith(f"{product.name} x 2") for e in elements(obs))
    obs = act(env, "click", bid=bid(obs, f"Remove {product.name}")).observation
    assert env.browser.cart == {} and any(e["name"] == "Your cart is empty." for e in elements(obs))
    obs = act(env, "goto", url="/nowhere").observation
    assert any("404" in e["name"] for e in elements(obs))


def test_scroll_moves_the_viewport(env: WebShopEnv) -> None:
    obs = act(env, "goto", url="/search?q=a").observation  # matches most of the catalog
    tree = json.loads(obs.axtree)
    assert tree["scroll"]["total"] > VIEWPORT and len(tree["elements"]) == VIEWPORT
    down = json.loads(act(env, "scroll", direction="down").observation.axtree)
    assert down["scroll"]["first"] > 0 and down["elements"][0]["bid"] != tree["elements"][0]["bid"]
    up = json.loads(act(env, "scroll", direction="up").observation.axtree)
    assert up["elements"] == tree["elements"]


@pytest.mark.parametrize(
    ("function", "arguments", "expected"),
    [
        ("hover", {"bid": "1"}, "unknown tool 'hover'"),
        ("click", {}, "missing required argument 'bid'"),
        ("click", {"bid": "1", "button": "left"}, "unexpected argument 'button'"),
        ("click", {"bid": 1}, "argument 'bid' must be of type string, got integer"),
        ("scroll", {"direction": "left"}, "must be one of"),
        ("click", {"bid": "999"}, "no element with bid '999'"),
        ("type", {"bid": "1", "text": "x"}, "is not a text box"),
        ("go_back", {}, "no previous page"),
    ],
)
def test_invalid_actions_are_refused(env: WebShopEnv, function: str, arguments: dict, expected: str) -> None:
    before = copy.deepcopy(env.browser)
    r = run(env.step(ApiAction(function=function, arguments=arguments)))
    assert expected in r.info["error"] and r.observation.content.startswith("Error:") and not r.done
    assert env.browser == before


def test_non_clickable_and_code_actions_refused(env: WebShopEnv) -> None:
    heading = next(e["bid"] for e in elements(env.observe()) if e["role"] == "heading")
    assert "not clickable" in act(env, "click", bid=heading).info["error"]
    assert "not supported" in run(env.step(CodeAction(language="python", content="1"))).info["error"]


def test_checkout_requires_fields(env: WebShopEnv) -> None:
    p = env.site.catalog[1]
    act(env, "goto", url=f"/product/{p.product_id}")
    act(env, "click", bid=bid(env.observe(), "Add to cart"))
    obs = act(env, "goto", url="/checkout").observation
    act(env, "type", bid=bid(obs, "Full name"), text="Ana Lopez")
    obs = act(env, "click", bid=bid(env.observe(), "Place order")).observation
    assert any("Please fill in: address, city, zip" in e["name"] for e in elements(obs)) and not env.browser.orders


@pytest.mark.parametrize("index", range(6))
def test_reference_solutions_earn_reward_one(tasks: list[Task], index: int) -> None:
    task = tasks[index]
    env = WebShopEnv(seed=0)
    run(env.reset(task))
    actions = run(reference_actions(task))
    for a in actions[:-1]:
        r = run(env.step(a))
        assert not r.info and not r.done
    r = run(env.step(actions[-1]))
    assert r.done and reward(env) == 1.0 and run(env.evaluate()).success


def test_wrong_outcomes_earn_zero(tasks: list[Task]) -> None:
    env = WebShopEnv(seed=0)
    purchase = next(t for t in tasks if t.metadata["kind"] == "purchase")
    run(env.reset(purchase))
    (pid, qty), = purchase.goal["items"].items()
    wrong = next(p for p in env.site.catalog if p.product_id != pid)
    act(env, "goto", url=f"/product/{wrong.product_id}")
    act(env, "click", bid=bid(env.observe(), "Add to cart"))
    obs = act(env, "goto", url="/checkout").observation
    for label, key in (("Full name", "name"), ("Street address", "address"), ("City", "city"), ("Zip code", "zip")):
        act(env, "type", bid=bid(obs, label), text=purchase.goal["shipping"][key])
    act(env, "click", bid=bid(env.observe(), "Place order"))
    run(env.step(MessageAction(content="Bought it.")))
    assert env.browser.orders and reward(env) == 0.0

    answer = next(t for t in tasks if t.metadata["kind"] == "answer")
    run(env.reset(answer))
    r = run(env.step(MessageAction(content="It costs $1,000.00.")))
    assert r.done and reward(env) == 0.0


def test_snapshot_restore_branches(tasks: list[Task]) -> None:
    env = WebShopEnv(seed=0)
    run(env.reset(tasks[0]))
    a, b = env.site.catalog[0], env.site.catalog[1]
    root = env.snapshot()
    act(env, "goto", url=f"/product/{a.product_id}")
    act(env, "click", bid=bid(env.observe(), "Add to cart"))
    branch_a = env.snapshot()
    env.restore(root)
    assert env.browser.cart == {} and env.browser.url == "http://shop.local/"
    act(env, "goto", url=f"/product/{b.product_id}")
    act(env, "click", bid=bid(env.observe(), "Add to cart"))
    assert env.browser.cart == {b.product_id: 1}
    env.restore(branch_a)
    assert env.browser.cart == {a.product_id: 1}
    act(env, "click", bid=bid(env.observe(), "Add to cart"))  # mutating after restore must not touch the snapshot
    env.restore(branch_a)
    assert env.browser.cart == {a.product_id: 1} and env.browser.history == ["http://shop.local/"]


def test_same_seed_same_catalog_and_tasks() -> None:
    assert generate_catalog(3) == generate_catalog(3) and generate_catalog(3) != generate_catalog(4)
    a, b = generate_tasks(6, seed=2, catalog_seed=3), generate_tasks(6, seed=2, catalog_seed=3)
    assert [t.model_dump() for t in a] == [t.model_dump() for t in b]
    assert [t.instruction for t in generate_tasks(6, seed=5, catalog_seed=3)] != [t.instruction for t in a]
    obs1 = run(WebShopEnv(seed=3).reset(a[0]))
    obs2 = run(WebShopEnv(seed=3).reset(b[0]))
    assert obs1 == obs2


def test_a_task_opens_on_its_start_page(tasks: list[Task]) -> None:
    env = WebShopEnv(seed=0)
    task = tasks[0].model_copy(update={"params": {**tasks[0].params, "start_url": "/search?q=mug"}})
    opening = run(env.reset(task))
    assert opening[-1].url == "http://shop.local/search?q=mug" and "mug" in opening[-1].axtree.lower()
    home = run(env.reset(tasks[0]))
    assert home[-1].url == "http://shop.local/"

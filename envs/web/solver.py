"""A scripted reference solution for web tasks (for tests, demos and tutorial-style replays)."""

from __future__ import annotations

from envs.base import Task
from envs.web.env import WebShopEnv
from envs.web.site import CHECKOUT_FIELDS
from schemas.models import ApiAction, MessageAction


def _bid(env: WebShopEnv, *, name: str | None = None, prefix: str | None = None, field: str | None = None) -> str:
    for el in env.site.render(env.browser).elements:
        if (name is not None and el.name == name) or (prefix is not None and el.name.startswith(prefix)) or (
                field is not None and el.field == field):
            return el.bid
    raise LookupError(f"no element {name or prefix or field!r} on {env.browser.url}")


async def reference_actions(task: Task) -> list[ApiAction | MessageAction]:
    """Actions that solve `task`, found by driving a scratch environment like a user would."""
    env = WebShopEnv(seed=int(task.params.get("catalog_seed", 0)))
    await env.reset(task)
    actions: list[ApiAction | MessageAction] = []

    async def do(function: str, **arguments: object) -> None:
        action = ApiAction(function=function, arguments=arguments)
        result = await env.step(action)
        if result.info.get("error"):
            raise RuntimeError(result.info["error"])
        actions.append(action)

    async def open_product(pid: str) -> None:
        p = env.site.by_id[pid]
        await do("type", bid=_bid(env, field="search"), text=f"{p.color} {p.noun}", press_enter=True)
        await do("click", bid=_bid(env, prefix=f"{p.name} - "))

    goal = task.goal
    if goal["type"] == "answer":
        await open_product(goal["product_id"])
        p = env.site.by_id[goal["product_id"]]
        actions.append(MessageAction(content=f"The {p.name} costs {p.price}."))
        return actions
    for pid, qty in goal["items"].items():
        await open_product(pid)
        if qty != 1:
            await do("type", bid=_bid(env, field=f"qty:{pid}"), text=str(qty))
        await do("click", bid=_bid(env, name="Add to cart"))
    if goal["type"] == "purchase":
        await do("click", bid=_bid(env, prefix="Cart ("))
        await do("click", bid=_bid(env, name="Checkout"))
        for f in CHECKOUT_FIELDS:
            await do("type", bid=_bid(env, field=f"checkout:{f}"), text=goal["shipping"][f])
        await do("click", bid=_bid(env, name="Place order"))
    actions.append(MessageAction(content="Done."))
    return actions

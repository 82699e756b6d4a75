"""The shop's pages and transitions: a pure state machine from (state, browser action) to the next state.

A page is a list of elements (bid, role, name, value, clickable) like a browser accessibility
tree; each clickable element carries a hidden effect that the machine applies on click.
"""

from __future__ import annotations

import html as html_lib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote_plus, urlsplit

from envs.web.catalog import Product

ORIGIN = "http://shop.local"
VIEWPORT = 20  # elements visible at once; scroll moves by half a viewport
CHECKOUT_FIELDS = ("name", "address", "city", "zip")


class ActionError(Exception):
    """The action cannot be applied on this page (unknown bid, wrong element kind); state unchanged."""


@dataclass
class Element:
    bid: str
    role: str  # link | button | textbox | heading | text
    name: str
    value: str | None = None
    clickable: bool = False
    # Hidden from the agent: what a click does, and which form field a textbox edits.
    effect: tuple[Any, ...] | None = None
    field: str | None = None

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bid": self.bid, "role": self.role, "name": self.name, "clickable": self.clickable}
        if self.role == "textbox":
            out["value"] = self.value or ""
        return out


@dataclass
class Order:
    order_id: str
    items: dict[str, int]
    shipping: dict[str, str]
    total_cents: int


@dataclass
class BrowserState:
    """The whole mutable world: page, history, form fields, cart, placed orders."""

    url: str = ORIGIN + "/"
    history: list[str] = field(default_factory=list)
    scroll: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    cart: dict[str, int] = field(default_factory=dict)  # product_id -> quantity, in insertion order
    orders: list[Order] = field(default_factory=list)
    alert: str | None = None


@dataclass
class Page:
    url: str
    title: str
    elements: list[Element]


class Site:
    """Renders pages for a catalog and applies actions to a BrowserState."""

    def __init__(self, catalog: tuple[Product, ...]) -> None:
        self.catalog = catalog
        self.by_id = {p.product_id: p for p in catalog}
        self.categories = sorted({p.category for p in catalog})

    # --- rendering -------------------------------------------------------------------------
    def render(self, state: BrowserState) -> Page:
        parts = urlsplit(state.url)
        path, query = parts.path or "/", parse_qs(parts.query)
        els: list[tuple] = []
        if parts.netloc and f"{parts.scheme}://{parts.netloc}" != ORIGIN:
            title, els = "Not found", [("heading", "This site can't be reached"), ("link", "Home", ("goto", "/"))]
        elif path == "/":
            title, els = "Shop - Home", self._home(state)
        elif path == "/search":
            q = query.get("q", [""])[0]
            title = f"Search: {q}"
            els = self._header(state, q) + [("heading", f"Results for '{q}'")] + self._listing(self.search(q))
        elif path.startswith("/category/") and path[10:] in self.categories:
            c = path[10:]
            title = f"Category: {c}"
            els = self._header(state) + [("heading", f"Category: {c}")] + self._listing(
                [p for p in self.catalog if p.category == c])
        elif path.startswith("/product/") and path[9:] in self.by_id:
            p = self.by_id[path[9:]]
            title = p.name
            els = self._header(state) + [
                ("heading", p.name), ("text", f"Price: {p.price}"), ("text", f"Rating: {p.rating} / 5"),
                ("text", p.description), ("textbox", "Quantity", f"qty:{p.product_id}", "1"),
                ("button", "Add to cart", ("add_to_cart", p.product_id)),
            ]
        elif path == "/cart":
            title, els = "Cart", self._cart(state)
        elif path == "/checkout":
            title = "Checkout"
            els = self._header(state) + [("heading", "Checkout"), ("text", f"Total: {self._total(state)}")] + [
                ("textbox", label, f"checkout:{f}", "") for f, label in
                zip(CHECKOUT_FIELDS, ("Full name", "Street address", "City", "Zip code"))
            ] + [("button", "Place order", ("place_order",))]
        elif path.startswith("/order/") and any(o.order_id == path[7:] for o in state.orders):
            order = next(o for o in state.orders if o.order_id == path[7:])
            title = f"Order {order.order_id}"
            els = self._header(state) + [("heading", f"Order #{order.order_id} confirmed")] + [
                ("text", f"{self.by_id[pid].name} x {qty}") for pid, qty in order.items.items()
            ] + [("text", f"Total: ${order.total_cents / 100:.2f}"), ("text", f"Ship to: {order.shipping['name']}")]
        else:
            title, els = "Not found", self._header(state) + [("heading", "404 - page not found")]
        if state.alert:
            els.insert(0, ("text", f"Alert: {state.alert}"))
        return Page(state.url, title, [self._element(i, spec, state) for i, spec in enumerate(els)])

    def _element(self, i: int, spec: tuple, state: BrowserState) -> Element:
        role, name = spec[0], spec[1]
        bid = str(i + 1)
        if role == "textbox":
            fld, default = spec[2], spec[3]
            return Element(bid, role, name, state.fields.get(fld, default), clickable=True, field=fld)
        if role in ("link", "button"):
            return Element(bid, role, name, clickable=True, effect=spec[2])
        return Element(bid, role, name)

    def _header(self, state: BrowserState, q: str | None = None) -> list[tuple]:
        count = sum(state.cart.values())
        head: list[tuple] = [("link", "Home", ("goto", "/")), ("link", f"Cart ({count})", ("goto", "/cart"))]
        head.append(("textbox", "Search products", "search", q if q is not None else ""))
        head.append(("button", "Search", ("search",)))
        return head

    def _home(self, state: BrowserState) -> list[tuple]:
        els = self._header(state) + [("heading", "Welcome to the shop")]
        els += [("link", f"Category: {c}", ("goto", f"/category/{c}")) for c in self.categories]
        els += [("heading", "Featured")] + self._listing(list(self.catalog[:4]))
        return els

    def _listing(self, products: list[Product]) -> list[tuple]:
        if not products:
            return [("text", "No products found.")]
        return [("link", f"{p.name} - {p.price}", ("goto", f"/product/{p.product_id}")) for p in products]

    def _cart(self, state: BrowserState) -> list[tuple]:
        els = self._header(state) + [("heading", "Your cart")]
        if not state.cart:
            return els + [("text", "Your cart is empty.")]
        for pid, qty in state.cart.items():
            p = self.by_id[pid]
            els += [("text", f"{p.name} x {qty} - ${p.price_cents * qty / 100:.2f}"),
                    ("button", f"Remove {p.name}", ("remove", pid))]
        return els + [("text", f"Total: {self._total(state)}"), ("button", "Checkout", ("goto", "/checkout"))]

    def _total(self, state: BrowserState) -> str:
        return f"${sum(self.by_id[p].price_cents * q for p, q in state.cart.items()) / 100:.2f}"

    def search(self, query: str) -> list[Product]:
        words = query.lower().split()
        return [p for p in self.catalog if words and all(w in f"{p.name} {p.category}".lower() for w in words)]

    # --- observations --------------------------------------------------------------------------
    def axtree(self, state: BrowserState, page: Page) -> str:
        visible = page.elements[state.scroll: state.scroll + VIEWPORT]
        return json.dumps({
            "url": page.url, "title": page.title, "elements": [e.public() for e in visible],
            "scroll": {"first": state.scroll, "shown": len(visible), "total": len(page.elements)},
        })

    @staticmethod
    def html(page: Page) -> str:
        tags = {"link": "a", "button": "button", "heading": "h1", "text": "p"}
        body = []
        for e in page.elements:
            name = html_lib.escape(e.name)
            if e.role == "textbox":
                body.append(f'<input bid="{e.bid}" aria-label="{name}" value="{html_lib.escape(e.value or "")}">')
            else:
                t = tags[e.role]
                body.append(f'<{t} bid="{e.bid}">{name}</{t}>')
        return f"<html><head><title>{html_lib.escape(page.title)}</title></head><body>{''.join(body)}</body></html>"

    # --- transitions ---------------------------------------------------------------------------
    def navigate(self, state: BrowserState, url: str) -> None:
        if url.startswith("/"):
            url = ORIGIN + url
        state.history.append(state.url)
        state.url, state.scroll, state.alert = url, 0, None

    def _find(self, page: Page, bid: str) -> Element:
        el = next((e for e in page.elements if e.bid == bid), None)
        if el is None:
            raise ActionError(f"no element with bid {bid!r} on this page")
        return el

    def click(self, state: BrowserState, bid: str) -> None:
        page = self.render(state)
        el = self._find(page, bid)
        if not el.clickable:
            raise ActionError(f"element {bid} ({el.role} {el.name!r}) is not clickable")
        if el.role == "textbox":
            return  # focusing a field changes nothing
        assert el.effect is not None
        kind, *rest = el.effect
        if kind == "goto":
            self.navigate(state, rest[0])
        elif kind == "search":
            self.navigate(state, f"/search?q={quote_plus(state.fields.get('search', '').strip())}")
        elif kind == "add_to_cart":
            pid = rest[0]
            raw = state.fields.get(f"qty:{pid}", "1").strip()
            if not raw.isdigit() or not 1 <= int(raw) <= 99:
                state.alert = "Quantity must be a whole number from 1 to 99."
                return
            state.cart[pid] = state.cart.get(pid, 0) + int(raw)
            state.fields.pop(f"qty:{pid}", None)
            state.alert = f"Added {raw} x {self.by_id[pid].name} to the cart."
        elif kind == "remove":
            state.cart.pop(rest[0], None)
            state.alert = None
        elif kind == "place_order":
            self._place_order(state)

    def _place_order(self, state: BrowserState) -> None:
        if not state.cart:
            state.alert = "Your cart is empty."
            return
        missing = [f for f in CHECKOUT_FIELDS if not state.fields.get(f"checkout:{f}", "").strip()]
        if missing:
            state.alert = f"Please fill in: {', '.join(missing)}."
            return
        order = Order(
            order_id=str(1001 + len(state.orders)), items=dict(state.cart),
            shipping={f: state.fields[f"checkout:{f}"].strip() for f in CHECKOUT_FIELDS},
            total_cents=sum(self.by_id[p].price_cents * q for p, q in state.cart.items()),
        )
        state.orders.append(order)
        state.cart.clear()
        for f in CHECKOUT_FIELDS:
            state.fields.pop(f"checkout:{f}", None)
        self.navigate(state, f"/order/{order.order_id}")

    def type(self, state: BrowserState, bid: str, text: str, press_enter: bool = False) -> None:
        page = self.render(state)
        el = self._find(page, bid)
        if el.role != "textbox" or el.field is None:
            raise ActionError(f"element {bid} ({el.role} {el.name!r}) is not a text box")
        state.fields[el.field] = text
        if press_enter:
            if el.field == "search":
                self.click(state, next(e.bid for e in page.elements if e.effect == ("search",)))
            elif el.field.startswith("qty:"):
                self.click(state, next(e.bid for e in page.elements if e.effect and e.effect[0] == "add_to_cart"))
            elif el.field.startswith("checkout:"):
                self._place_order(state)

    def scroll(self, state: BrowserState, direction: str) -> None:
        total = len(self.render(state).elements)
        step = VIEWPORT // 2
        if direction == "down":
            state.scroll = max(0, min(state.scroll + step, total - VIEWPORT))
        else:
            state.scroll = max(0, state.scroll - step)

    def go_back(self, state: BrowserState) -> None:
        if not state.history:
            raise ActionError("there is no previous page")
        state.url, state.scroll, state.alert = state.history.pop(), 0, None

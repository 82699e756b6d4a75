"""The retail tools: JSON Schema declarations, implementations over RetailDB, and their business rules."""

from __future__ import annotations

import json
from typing import Any

from envs.retail.db import RetailDB
from envs.toolspec import ToolSpec, obj

CANCEL_REASONS = ["no longer needed", "ordered by mistake"]
ADDRESS_FIELDS = ("address1", "address2", "city", "state", "country", "zip")


class ToolError(Exception):
    """A business-rule violation or a lookup that found nothing; the state is left unchanged."""


def dollars(cents: int) -> float:
    return round(cents / 100, 2)


_STR = {"type": "string"}
_IDS = {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True}
_ADDRESS_PROPS = {f: {"type": "string", "description": f.replace("address", "address line ")} for f in ADDRESS_FIELDS}


# --- lookups -----------------------------------------------------------------------------------
def _user(db: RetailDB, user_id: str) -> dict[str, Any]:
    user = db.one("SELECT * FROM users WHERE user_id = ?", [user_id])
    if user is None:
        raise ToolError(f"user {user_id!r} not found")
    return user


def _order(db: RetailDB, order_id: str) -> dict[str, Any]:
    order = db.one("SELECT * FROM orders WHERE order_id = ?", [order_id])
    if order is None:
        raise ToolError(f"order {order_id!r} not found")
    return order


def _payment_method(db: RetailDB, user_id: str, payment_method_id: str) -> dict[str, Any]:
    pm = db.one("SELECT * FROM payment_methods WHERE payment_method_id = ? AND user_id = ?", [payment_method_id, user_id])
    if pm is None:
        raise ToolError(f"payment method {payment_method_id!r} not found for user {user_id!r}")
    return pm


def _address(row: dict[str, Any]) -> dict[str, str]:
    return {f: row[f] for f in ADDRESS_FIELDS}


def find_user_id_by_email(db: RetailDB, email: str) -> str:
    user = db.one("SELECT user_id FROM users WHERE lower(email) = lower(?)", [email.strip()])
    if user is None:
        raise ToolError("user not found")
    return user["user_id"]


def find_user_id_by_name_zip(db: RetailDB, first_name: str, last_name: str, zip: str) -> str:
    user = db.one(
        "SELECT user_id FROM users WHERE lower(first_name) = lower(?) AND lower(last_name) = lower(?) AND zip = ? ORDER BY user_id",
        [first_name.strip(), last_name.strip(), zip.strip()],
    )
    if user is None:
        raise ToolError("user not found")
    return user["user_id"]


def get_user_details(db: RetailDB, user_id: str) -> dict[str, Any]:
    user = _user(db, user_id)
    methods = db.rows("SELECT * FROM payment_methods WHERE user_id = ? ORDER BY payment_method_id", [user_id])
    orders = db.rows("SELECT order_id FROM orders WHERE user_id = ? ORDER BY created_at, order_id", [user_id])
    return {
        "user_id": user_id,
        "name": {"first_name": user["first_name"], "last_name": user["last_name"]},
        "email": user["email"],
        "address": _address(user),
        "payment_methods": [_format_payment_method(m) for m in methods],
        "orders": [o["order_id"] for o in orders],
    }


def _format_payment_method(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"payment_method_id": m["payment_method_id"], "source": m["source"]}
    if m["source"] == "credit_card":
        out.update(brand=m["brand"], last_four=m["last_four"])
    if m["source"] == "gift_card":
        out["balance"] = dollars(m["balance_cents"])
    return out


def list_user_orders(db: RetailDB, user_id: str) -> list[dict[str, Any]]:
    _user(db, user_id)
    return [
        {"order_id": r["order_id"], "status": r["status"], "created_at": r["created_at"], "total": dollars(r["total"])}
        for r in db.rows(
            "SELECT o.order_id, o.status, o.created_at, COALESCE(SUM(i.price_cents), 0) AS total "
            "FROM orders o LEFT JOIN order_items i USING (order_id) WHERE o.user_id = ? "
            "GROUP BY o.order_id, o.status, o.created_at ORDER BY o.created_at, o.order_id",
            [user_id],
        )
    ]


def get_order_details(db: RetailDB, order_id: str) -> dict[str, Any]:
    order = _order(db, order_id)
    items = db.rows(
        "SELECT i.*, p.name, v.options FROM order_items i JOIN products p USING (product_id) "
        "JOIN variants v ON v.item_id = i.item_id WHERE i.order_id = ? ORDER BY i.line_no",
        [order_id],
    )
    txs = db.rows("SELECT * FROM transactions WHERE order_id = ? ORDER BY seq", [order_id])
    out: dict[str, Any] = {
        "order_id": order_id, "user_id": order["user_id"], "status": order["status"],
        "created_at": order["created_at"], "address": _address(order),
        "payment_method_id": order["payment_method_id"],
        "items": [
            {"item_id": i["item_id"], "product_id": i["product_id"], "name": i["name"],
             "options": json.loads(i["options"]), "price": dollars(i["price_cents"]), "status": i["status"],
             **({"new_item_id": i["new_item_id"]} if i["new_item_id"] else {})}
            for i in items
        ],
        "total": dollars(sum(i["price_cents"] for i in items)),
        "payment_history": [
            {"kind": t["kind"], "amount": dollars(t["amount_cents"]), "payment_method_id": t["payment_method_id"]} for t in txs
        ],
    }
    if order["cancel_reason"]:
        out["cancel_reason"] = order["cancel_reason"]
    return out


def get_product_details(db: RetailDB, product_id: str) -> dict[str, Any]:
    product = db.one("SELECT * FROM products WHERE product_id = ?", [product_id])
    if product is None:
        raise ToolError(f"product {product_id!r} not found")
    variants = db.rows("SELECT * FROM variants WHERE product_id = ? ORDER BY item_id", [product_id])
    return {
        **product,
        "variants": {
            v["item_id"]: {"options": json.loads(v["options"]), "price": dollars(v["price_cents"]), "available": v["stock"] > 0}
            for v in variants
        },
    }


def search_products(db: RetailDB, query: str, max_price: float | None = None) -> list[dict[str, Any]]:
    words = [w for w in query.lower().split() if w]
    if not words:
        raise ToolError("query must not be empty")
    where = " AND ".join("(lower(p.name) LIKE ? OR lower(p.category) LIKE ?)" for _ in words)
    params: list[Any] = [x for w in words for x in (f"%{w}%", f"%{w}%")]
    having = ""
    if max_price is not None:
        having = "HAVING MIN(v.price_cents) <= ?"
        params.append(int(round(max_price * 100)))
    rows = db.rows(
        f"SELECT p.product_id, p.name, p.category, MIN(v.price_cents) AS min_price FROM products p "
        f"JOIN variants v USING (product_id) WHERE {where} GROUP BY p.product_id, p.name, p.category {having} "
        f"ORDER BY p.name",
        params,
    )
    return [{**{k: r[k] for k in ("product_id", "name", "category")}, "min_price": dollars(r["min_price"])} for r in rows]


# --- writes ------------------------------------------------------------------------------------
def _next_seq(db: RetailDB, order_id: str) -> int:
    return db.one("SELECT COALESCE(MAX(seq), -1) + 1 AS s FROM transactions WHERE order_id = ?", [order_id])["s"]


def _add_transaction(db: RetailDB, order_id: str, pm: dict[str, Any], kind: str, cents: int) -> None:
    db.write("transactions", "INSERT INTO transactions VALUES (?, ?, ?, ?, ?)",
             [order_id, _next_seq(db, order_id), pm["payment_method_id"], kind, cents])
    if pm["source"] == "gift_card":
        delta = cents if kind == "refund" else -cents
        db.write("payment_methods", "UPDATE payment_methods SET balance_cents = balance_cents + ? WHERE payment_method_id = ?",
                 [delta, pm["payment_method_id"]])


def _settle_difference(db: RetailDB, order: dict[str, Any], pm: dict[str, Any], diff: int) -> None:
    """Charge (diff > 0) or refund (diff < 0) a price difference; gift cards must cover a charge."""
    if diff > 0 and pm["source"] == "gift_card" and pm["balance_cents"] < diff:
        raise ToolError(f"insufficient gift card balance to pay the price difference of ${dollars(diff):.2f}")
    if diff:
        _add_transaction(db, order["order_id"], pm, "payment" if diff > 0 else "refund", abs(diff))


def _require_status(order: dict[str, Any], status: str, action: str) -> None:
    if order["status"] != status:
        raise ToolError(f"only {status} orders can be {action}; order {order['order_id']} is {order['status']}")


def _order_lines(db: RetailDB, order_id: str, item_ids: list[str]) -> list[dict[str, Any]]:
    lines = db.rows("SELECT * FROM order_items WHERE order_id = ? AND status = 'ordered' ORDER BY line_no", [order_id])
    picked, free = [], list(lines)
    for item_id in item_ids:
        match = next((ln for ln in free if ln["item_id"] == item_id), None)
        if match is None:
            raise ToolError(f"item {item_id!r} is not in order {order_id}")
        free.remove(match)
        picked.append(match)
    return picked


def _replacement_variants(db: RetailDB, lines: list[dict[str, Any]], new_item_ids: list[str]) -> list[dict[str, Any]]:
    if len(new_item_ids) != len(lines):
        raise ToolError("item_ids and new_item_ids must have the same length")
    out = []
    for line, new_id in zip(lines, new_item_ids):
        v = db.one("SELECT * FROM variants WHERE item_id = ?", [new_id])
        if v is None:
            raise ToolError(f"item {new_id!r} not found")
        if v["product_id"] != line["product_id"]:
            raise ToolError(f"new item {new_id} is not a variant of the same product as item {line['item_id']}")
        if new_id == line["item_id"]:
            raise ToolError(f"new item {new_id} is the same as the old item")
        if v["stock"] <= 0:
            raise ToolError(f"new item {new_id} is not available")
        out.append(v)
    return out


def cancel_pending_order(db: RetailDB, order_id: str, reason: str) -> dict[str, Any]:
    order = _order(db, order_id)
    _require_status(order, "pending", "cancelled")
    pm = _payment_method(db, order["user_id"], order["payment_method_id"])
    total = db.one("SELECT SUM(price_cents) AS t FROM order_items WHERE order_id = ?", [order_id])["t"]
    db.write("orders", "UPDATE orders SET status = 'cancelled', cancel_reason = ? WHERE order_id = ?", [reason, order_id])
    _add_transaction(db, order_id, pm, "refund", total)
    return get_order_details(db, order_id)


def modify_pending_order_address(db: RetailDB, order_id: str, **address: str) -> dict[str, Any]:
    order = _order(db, order_id)
    _require_status(order, "pending", "modified")
    sets = ", ".join(f"{f} = ?" for f in ADDRESS_FIELDS)
    db.write("orders", f"UPDATE orders SET {sets} WHERE order_id = ?", [address[f] for f in ADDRESS_FIELDS] + [order_id])
    return get_order_details(db, order_id)


def modify_pending_order_items(db: RetailDB, order_id: str, item_ids: list[str], new_item_ids: list[str],
                               payment_method_id: str) -> dict[str, Any]:
    order = _order(db, order_id)
    _require_status(order, "pending", "modified")
    lines = _order_lines(db, order_id, item_ids)
    new = _replacement_variants(db, lines, new_item_ids)
    pm = _payment_method(db, order["user_id"], payment_method_id)
    _settle_difference(db, order, pm, sum(v["price_cents"] for v in new) - sum(ln["price_cents"] for ln in lines))
    for line, v in zip(lines, new):
        db.write("order_items", "UPDATE order_items SET item_id = ?, price_cents = ? WHERE order_id = ? AND line_no = ?",
                 [v["item_id"], v["price_cents"], order_id, line["line_no"]])
    return get_order_details(db, order_id)


def return_delivered_order_items(db: RetailDB, order_id: str, item_ids: list[str], payment_method_id: str) -> dict[str, Any]:
    order = _order(db, order_id)
    _require_status(order, "delivered", "returned")
    lines = _order_lines(db, order_id, item_ids)
    pm = _payment_method(db, order["user_id"], payment_method_id)
    if payment_method_id != order["payment_method_id"] and pm["source"] != "gift_card":
        raise ToolError("the refund must go to the original payment method or to a gift card of the user")
    db.write("orders", "UPDATE orders SET status = 'return requested' WHERE order_id = ?", [order_id])
    for line in lines:
        db.write("order_items", "UPDATE order_items SET status = 'return requested' WHERE order_id = ? AND line_no = ?",
                 [order_id, line["line_no"]])
    _add_transaction(db, order_id, pm, "refund", sum(ln["price_cents"] for ln in lines))
    return get_order_details(db, order_id)


def exchange_delivered_order_items(db: RetailDB, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                   payment_method_id: str) -> dict[str, Any]:
    order = _order(db, order_id)
    _require_status(order, "delivered", "exchanged")
    lines = _order_lines(db, order_id, item_ids)
    new = _replacement_variants(db, lines, new_item_ids)
    pm = _payment_method(db, order["user_id"], payment_method_id)
    _settle_difference(db, order, pm, sum(v["price_cents"] for v in new) - sum(ln["price_cents"] for ln in lines))
    db.write("orders", "UPDATE orders SET status = 'exchange requested' WHERE order_id = ?", [order_id])
    for line, v in zip(lines, new):
        db.write("order_items", "UPDATE order_items SET status = 'exchange requested', new_item_id = ? WHERE order_id = ? AND line_no = ?",
                 [v["item_id"], order_id, line["line_no"]])
    return get_order_details(db, order_id)


def modify_user_address(db: RetailDB, user_id: str, **address: str) -> dict[str, Any]:
    _user(db, user_id)
    sets = ", ".join(f"{f} = ?" for f in ADDRESS_FIELDS)
    db.write("users", f"UPDATE users SET {sets} WHERE user_id = ?", [address[f] for f in ADDRESS_FIELDS] + [user_id])
    return get_user_details(db, user_id)


def transfer_to_human_agents(db: RetailDB, summary: str) -> str:
    return "Transfer successful"


def think(db: RetailDB, thought: str) -> str:
    return ""


_ORDER_ID = {"type": "string", "description": "The order id, such as '#W0000000' (with the '#')."}
_USER_ID = {"type": "string", "description": "The user id, such as 'ava_garcia_1001'."}
_PM_ID = {"type": "string", "description": "A payment method id of the user, such as 'credit_card_0000000' or 'gift_card_0000000'."}

TOOL_SPECS: dict[str, ToolSpec] = {s.name: s for s in [
    ToolSpec("find_user_id_by_email", "Find a user id by email.", obj({"email": _STR}), find_user_id_by_email),
    ToolSpec("find_user_id_by_name_zip", "Find a user id by first name, last name and zip code.",
             obj({"first_name": _STR, "last_name": _STR, "zip": _STR}), find_user_id_by_name_zip),
    ToolSpec("get_user_details", "Get a user's profile, payment methods and order ids.", obj({"user_id": _USER_ID}), get_user_details),
    ToolSpec("list_user_orders", "List a user's orders with status and total.", obj({"user_id": _USER_ID}), list_user_orders),
    ToolSpec("get_order_details", "Get an order's status, items, address and payment history.",
             obj({"order_id": _ORDER_ID}), get_order_details),
    ToolSpec("get_product_details", "Get a product and its variants (item ids, options, price, availability).",
             obj({"product_id": _STR}), get_product_details),
    ToolSpec("search_products", "Search products by words in their name or category, optionally under a maximum price.",
             obj({"query": _STR, "max_price": {"type": "number", "minimum": 0}}, required=["query"]), search_products),
    ToolSpec("cancel_pending_order",
             "Cancel a pending order; the total is refunded to the original payment method. "
             "The user must confirm and give a reason.",
             obj({"order_id": _ORDER_ID, "reason": {"type": "string", "enum": CANCEL_REASONS}}), cancel_pending_order, mutates=True),
    ToolSpec("modify_pending_order_address", "Change the shipping address of a pending order.",
             obj({"order_id": _ORDER_ID, **_ADDRESS_PROPS}), modify_pending_order_address, mutates=True),
    ToolSpec("modify_pending_order_items",
             "Swap items of a pending order for other variants of the same products; the price difference is "
             "charged to or refunded to the given payment method.",
             obj({"order_id": _ORDER_ID, "item_ids": _IDS, "new_item_ids": _IDS, "payment_method_id": _PM_ID}),
             modify_pending_order_items, mutates=True),
    ToolSpec("return_delivered_order_items",
             "Return items of a delivered order; the refund goes to the original payment method or a gift card.",
             obj({"order_id": _ORDER_ID, "item_ids": _IDS, "payment_method_id": _PM_ID}),
             return_delivered_order_items, mutates=True),
    ToolSpec("exchange_delivered_order_items",
             "Exchange items of a delivered order for other available variants of the same products.",
             obj({"order_id": _ORDER_ID, "item_ids": _IDS, "new_item_ids": _IDS, "payment_method_id": _PM_ID}),
             exchange_delivered_order_items, mutates=True),
    ToolSpec("modify_user_address", "Change a user's default address.", obj({"user_id": _USER_ID, **_ADDRESS_PROPS}),
             modify_user_address, mutates=True),
    ToolSpec("transfer_to_human_agents", "Transfer the user to a human agent, with a summary; ends the conversation.",
             obj({"summary": _STR}), transfer_to_human_agents),
    ToolSpec("think", "Think out loud; changes nothing.", obj({"thought": _STR}), think),
]}


def call_tool(db: RetailDB, name: str, arguments: dict[str, Any]) -> Any:
    """Run a validated call; a mutating tool runs in a transaction so a refused call changes nothing."""
    spec = TOOL_SPECS[name]
    if not spec.mutates:
        return spec.fn(db, **arguments)
    db.begin()
    try:
        result = spec.fn(db, **arguments)
    except BaseException:
        db.rollback()
        raise
    db.commit()
    return result

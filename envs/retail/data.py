"""Deterministic generation of the retail world (users, payment methods, products, variants, orders) from a seed."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

Rows = dict[str, list[dict[str, Any]]]

# Column name -> SQL type, per table; the first column(s) listed in PRIMARY_KEYS order rows.
TABLES: dict[str, dict[str, str]] = {
    "users": {
        "user_id": "VARCHAR", "first_name": "VARCHAR", "last_name": "VARCHAR", "email": "VARCHAR",
        "address1": "VARCHAR", "address2": "VARCHAR", "city": "VARCHAR", "state": "VARCHAR",
        "country": "VARCHAR", "zip": "VARCHAR",
    },
    "payment_methods": {
        "payment_method_id": "VARCHAR", "user_id": "VARCHAR", "source": "VARCHAR",
        "brand": "VARCHAR", "last_four": "VARCHAR", "balance_cents": "BIGINT",
    },
    "products": {"product_id": "VARCHAR", "name": "VARCHAR", "category": "VARCHAR"},
    "variants": {
        "item_id": "VARCHAR", "product_id": "VARCHAR", "options": "VARCHAR",
        "price_cents": "BIGINT", "stock": "INTEGER",
    },
    "orders": {
        "order_id": "VARCHAR", "user_id": "VARCHAR", "status": "VARCHAR", "payment_method_id": "VARCHAR",
        "address1": "VARCHAR", "address2": "VARCHAR", "city": "VARCHAR", "state": "VARCHAR",
        "country": "VARCHAR", "zip": "VARCHAR", "created_at": "VARCHAR", "cancel_reason": "VARCHAR",
    },
    "order_items": {
        "order_id": "VARCHAR", "line_no": "INTEGER", "item_id": "VARCHAR", "product_id": "VARCHAR",
        "price_cents": "BIGINT", "status": "VARCHAR", "new_item_id": "VARCHAR",
    },
    "transactions": {
        "order_id": "VARCHAR", "seq": "INTEGER", "payment_method_id": "VARCHAR",
        "kind": "VARCHAR", "amount_cents": "BIGINT",
    },
}
PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "users": ("user_id",), "payment_methods": ("payment_method_id",), "products": ("product_id",),
    "variants": ("item_id",), "orders": ("order_id",), "order_items": ("order_id", "line_no"),
    "transactions": ("order_id", "seq"),
}

FIRST_NAMES = ["Ava", "Noah", "Mia", "Liam", "Zoe", "Ethan", "Isla", "Omar", "Lena", "Raj",
               "Yara", "Sven", "Aiko", "Diego", "Nora", "Ivan", "Chloe", "Malik", "Sofia", "Ken"]
LAST_NAMES = ["Garcia", "Smith", "Nguyen", "Kowalski", "Okafor", "Tanaka", "Rossi", "Muller",
              "Silva", "Patel", "Johansson", "Ahmed", "Kim", "Lopez", "Brown", "Cohen"]
STREETS = ["Maple Ave", "Oak St", "Pine Rd", "Cedar Ln", "Elm St", "Birch Way", "Lake Dr", "Hill Rd"]
CITIES = [("Austin", "TX"), ("Denver", "CO"), ("Portland", "OR"), ("Boston", "MA"), ("Seattle", "WA"),
          ("Chicago", "IL"), ("Phoenix", "AZ"), ("Columbus", "OH")]
COLORS = ["red", "blue", "black", "white", "green", "grey"]
# Product type -> (category, option axes); variants are drawn from the axes' product.
PRODUCT_TYPES: dict[str, tuple[str, dict[str, list[str]]]] = {
    "T-Shirt": ("apparel", {"color": COLORS, "size": ["S", "M", "L", "XL"]}),
    "Running Shoes": ("apparel", {"color": COLORS, "size": ["7", "8", "9", "10", "11"]}),
    "Hoodie": ("apparel", {"color": COLORS, "size": ["S", "M", "L"]}),
    "Water Bottle": ("outdoor", {"color": COLORS, "capacity": ["500ml", "750ml", "1000ml"]}),
    "Backpack": ("outdoor", {"color": COLORS, "size": ["small", "medium", "large"]}),
    "Tent": ("outdoor", {"capacity": ["2-person", "4-person"], "color": ["green", "grey"]}),
    "Desk Lamp": ("home", {"color": COLORS, "power": ["USB", "battery", "AC adapter"]}),
    "Coffee Mug": ("home", {"color": COLORS, "capacity": ["250ml", "350ml"]}),
    "Office Chair": ("home", {"color": ["black", "grey"], "material": ["mesh", "leather", "fabric"]}),
    "Headphones": ("electronics", {"color": ["black", "white"], "type": ["in-ear", "over-ear"]}),
    "Keyboard": ("electronics", {"layout": ["US", "UK"], "switch": ["linear", "tactile", "clicky"]}),
    "Smart Watch": ("electronics", {"color": ["black", "silver"], "size": ["40mm", "44mm"]}),
}
BRAND_WORDS = ["Aurora", "Summit", "Nimbus", "Vertex", "Harbor", "Cobalt", "Willow", "Zephyr"]
PRICE_RANGES = {"apparel": (15, 120), "outdoor": (12, 300), "home": (8, 250), "electronics": (30, 400)}
ORDER_STATUSES = ["pending"] * 4 + ["processed"] * 2 + ["delivered"] * 3 + ["cancelled"]


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def generate_world(seed: int, n_users: int = 20, n_products: int = 30, n_orders: int = 40) -> Rows:
    """All table rows of a world; the same seed gives the same rows (Python's Random is stable)."""
    rng = random.Random(f"retail-world-{seed}")
    rows: Rows = {t: [] for t in TABLES}

    # Products and variants.
    type_names = sorted(PRODUCT_TYPES)
    used_names: set[str] = set()
    for _ in range(n_products):
        ptype = rng.choice(type_names)
        category, axes = PRODUCT_TYPES[ptype]
        name = f"{rng.choice(BRAND_WORDS)} {ptype}"
        while name in used_names:
            name = f"{rng.choice(BRAND_WORDS)} {rng.choice(BRAND_WORDS)} {ptype}"
        used_names.add(name)
        pid = _digits(rng, 10)
        rows["products"].append({"product_id": pid, "name": name, "category": category})
        combos = list(itertools.product(*axes.values()))
        lo, hi = PRICE_RANGES[category]
        base = rng.randint(lo * 100, hi * 100)
        for combo in rng.sample(combos, k=min(len(combos), rng.randint(3, 6))):
            options = dict(zip(axes.keys(), combo))
            rows["variants"].append({
                "item_id": _digits(rng, 10), "product_id": pid, "options": json.dumps(options, sort_keys=True),
                "price_cents": max(100, base + rng.randint(-300, 300)),
                # A few variants are out of stock so business rules about availability matter.
                "stock": 0 if rng.random() < 0.15 else rng.randint(1, 50),
            })

    # Users, their addresses and payment methods.
    for i in range(n_users):
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        uid = f"{first.lower()}_{last.lower()}_{1000 + i * 37 + rng.randint(0, 30)}"
        city, state = rng.choice(CITIES)
        rows["users"].append({
            "user_id": uid, "first_name": first, "last_name": last,
            "email": f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@example.com",
            "address1": f"{rng.randint(10, 9999)} {rng.choice(STREETS)}",
            "address2": f"Suite {rng.randint(100, 999)}" if rng.random() < 0.5 else "",
            "city": city, "state": state, "country": "USA", "zip": _digits(rng, 5),
        })
        sources = ["credit_card"] + rng.sample(["gift_card", "paypal", "credit_card"], k=rng.randint(0, 2))
        for source in sources:
            pm_id = f"{source}_{_digits(rng, 7)}"
            rows["payment_methods"].append({
                "payment_method_id": pm_id, "user_id": uid, "source": source,
                "brand": rng.choice(["visa", "mastercard", "amex"]) if source == "credit_card" else None,
                "last_four": _digits(rng, 4) if source == "credit_card" else None,
                "balance_cents": rng.randint(0, 300) * 100 if source == "gift_card" else None,
            })

    # Orders: every user gets at least one, the rest are spread at random.
    owners = [u["user_id"] for u in rows["users"]]
    owners += [rng.choice(owners) for _ in range(n_orders - len(owners))]
    used_order_ids: set[str] = set()
    variants = rows["variants"]
    for n, uid in enumerate(owners):
        user = next(u for u in rows["users"] if u["user_id"] == uid)
        methods = [p["payment_method_id"] for p in rows["payment_methods"] if p["user_id"] == uid]
        oid = f"#W{_digits(rng, 7)}"
        while oid in used_order_ids:
            oid = f"#W{_digits(rng, 7)}"
        used_order_ids.add(oid)
        status = rng.choice(ORDER_STATUSES)
        pm = rng.choice(methods)
        rows["orders"].append({
            "order_id": oid, "user_id": uid, "status": status, "payment_method_id": pm,
            **{k: user[k] for k in ("address1", "address2", "city", "state", "country", "zip")},
            "created_at": f"2024-{1 + n % 12:02d}-{1 + rng.randint(0, 27):02d}",
            "cancel_reason": "no longer needed" if status == "cancelled" else None,
        })
        items = rng.sample(variants, k=rng.randint(1, 4))
        for line_no, v in enumerate(items):
            rows["order_items"].append({
                "order_id": oid, "line_no": line_no, "item_id": v["item_id"], "product_id": v["product_id"],
                "price_cents": v["price_cents"], "status": "ordered", "new_item_id": None,
            })
        total = sum(v["price_cents"] for v in items)
        rows["transactions"].append({"order_id": oid, "seq": 0, "payment_method_id": pm, "kind": "payment", "amount_cents": total})
        if status == "cancelled":
            rows["transactions"].append({"order_id": oid, "seq": 1, "payment_method_id": pm, "kind": "refund", "amount_cents": total})
    return rows

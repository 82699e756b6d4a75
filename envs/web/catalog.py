"""Deterministic generation of the web shop's catalog from a seed."""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

COLORS = ["red", "blue", "green", "black", "white", "yellow"]
# noun -> (category, materials)
NOUNS: dict[str, tuple[str, list[str]]] = {
    "mug": ("kitchen", ["ceramic", "enamel", "glass"]),
    "teapot": ("kitchen", ["ceramic", "cast iron", "glass"]),
    "bowl": ("kitchen", ["bamboo", "ceramic", "steel"]),
    "notebook": ("office", ["paper", "leather", "recycled"]),
    "desk lamp": ("office", ["metal", "wooden", "plastic"]),
    "pen set": ("office", ["metal", "plastic", "wooden"]),
    "water bottle": ("outdoor", ["steel", "plastic", "glass"]),
    "backpack": ("outdoor", ["canvas", "nylon", "leather"]),
    "scarf": ("apparel", ["wool", "cotton", "silk"]),
    "cap": ("apparel", ["cotton", "wool", "denim"]),
}
PRICE_RANGES = {"kitchen": (4, 45), "office": (3, 60), "outdoor": (9, 120), "apparel": (6, 50)}


@dataclass(frozen=True)
class Product:
    product_id: str
    name: str
    color: str
    material: str
    noun: str
    category: str
    price_cents: int
    rating: float
    description: str

    @property
    def price(self) -> str:
        return f"${self.price_cents / 100:.2f}"


@lru_cache(maxsize=16)
def generate_catalog(seed: int, n_products: int = 28) -> tuple[Product, ...]:
    """`n_products` products with unique names; the same seed gives the same catalog."""
    rng = random.Random(f"web-catalog-{seed}")
    products: list[Product] = []
    names: set[str] = set()
    while len(products) < n_products:
        noun = rng.choice(sorted(NOUNS))
        category, materials = NOUNS[noun]
        color, material = rng.choice(COLORS), rng.choice(materials)
        name = f"{color.title()} {material.title()} {noun.title()}"
        if name in names:
            continue
        names.add(name)
        lo, hi = PRICE_RANGES[category]
        products.append(Product(
            product_id=f"p{len(products) + 1:03d}", name=name, color=color, material=material, noun=noun,
            category=category, price_cents=rng.randint(lo * 100, hi * 100) // 5 * 5 - 1,
            rating=round(rng.uniform(2.5, 5.0), 1),
            description=f"A {color} {noun} made of {material}. {rng.choice(['Great gift.', 'Bestseller.', 'New arrival.', 'Limited stock.'])}",
        ))
    return tuple(products)

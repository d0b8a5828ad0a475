"""A shopping cart as an entity: created by its first item, fed by at-least-once events.

Run it:

    .venv/bin/python examples/shopping_cart.py [STORE]     # default ./shopping-cart.db

The cart is the entity, its key the cart id. Every "item added" event is one atomic
`signal_with_start`: the first one creates the cart, and a redelivered event (same item
id) is answered `duplicate` by corral's own dedupe window, which outlives snapshots and
continue-as-new, so the cart keeps no set of seen ids. Checkout is an `update`: the
caller gets the total back. A long-lived cart continues as new when corral suggests it,
carrying its lines; after checkout the next item opens a new cart run for the same id
(`IdReusePolicy.ALLOW_DUPLICATE`).
"""

from __future__ import annotations

import asyncio
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

import corral


class CartItem(BaseModel):
    product_id: str
    quantity: int
    unit_price_cents: int


class CartInput(BaseModel):
    customer: str
    lines: list[CartItem] = []  # carried over by continue-as-new


class AddItem(BaseModel):
    item_id: str  # the event's id: the message id, so a redelivery is a duplicate
    item: CartItem


class Checkout(BaseModel):
    payment_ref: str


class Receipt(BaseModel):
    customer: str
    lines: int
    total_cents: int
    payment_ref: str


class Cart(corral.Entity):
    id_reuse = corral.IdReusePolicy.ALLOW_DUPLICATE  # after checkout, a new cart run
    continue_as_new_policy = corral.ContinueAsNewPolicy(max_signals=50)

    # The state snapshots keep: annotated attributes are encoded by pydantic (plain
    # JSON values such as `customer` need no annotation).
    lines: list[CartItem]
    receipt: Receipt | None

    def __init__(self, init: CartInput) -> None:
        self.customer = init.customer
        self.lines = list(init.lines)
        self.receipt = None

    @corral.signal
    def add_item(self, added: AddItem) -> None:
        self.lines.append(added.item)

    @corral.update
    def checkout(self, req: Checkout) -> Receipt:
        if self.receipt is None:
            self.receipt = Receipt(
                customer=self.customer, lines=len(self.lines), payment_ref=req.payment_ref,
                total_cents=sum(i.quantity * i.unit_price_cents for i in self.lines))
        return self.receipt

    @corral.query
    def total_cents(self) -> int:
        return sum(i.quantity * i.unit_price_cents for i in self.lines)

    async def run(self) -> Receipt:
        await self.wait_for(lambda: self.receipt is not None or self.continue_as_new_suggested)
        if self.receipt is None:  # a long-lived cart: start afresh, carrying its lines
            self.continue_as_new(CartInput(customer=self.customer, lines=self.lines))
        return self.receipt


@dataclass
class Report:
    sent: int = 0
    duplicates: int = 0
    expected_cents: int = 0
    receipt: Receipt | None = None
    runs: list[corral.RunSummary] = field(default_factory=list)
    reopened: corral.Ack | None = None


async def main(store: str | Path = "shopping-cart.db", *, items: int = 120) -> Report:
    """Add `items` items (each event delivered 1-3 times, concurrently), check out, then
    add one more item, which opens a new cart run."""
    report = Report()
    rng = random.Random(7)
    events = [AddItem(item_id=f"evt-{n}", item=CartItem(
        product_id=f"sku-{rng.randrange(30)}", quantity=rng.randint(1, 3),
        unit_price_cents=rng.randrange(199, 4999))) for n in range(items)]
    report.expected_cents = sum(e.item.quantity * e.item.unit_price_cents for e in events)
    deliveries = [e for e in events for _ in range(rng.randint(1, 3))]  # at-least-once
    rng.shuffle(deliveries)
    async with corral.open_runtime(str(store), entities=[Cart]) as rt:
        cart = rt.ref(Cart, "cart-42")

        async def deliver(event: AddItem) -> None:
            ack = await cart.signal_with_start(
                Cart.add_item, event, start=CartInput(customer="ada"),
                message_id=event.item_id)
            report.sent += 1
            report.duplicates += ack.status == "duplicate"

        await asyncio.gather(*(deliver(e) for e in deliveries))
        report.receipt = await cart.update(Cart.checkout, Checkout(payment_ref="pay-1"),
                                           update_id="checkout-1")
        await cart.result(timeout=30)
        report.reopened = await cart.signal_with_start(
            Cart.add_item, AddItem(item_id="evt-after", item=events[0].item),
            start=CartInput(customer="ada"), message_id="evt-after")
        report.runs = list((await cart.describe()).runs)
    switches = sum(r.status is corral.RunStatus.CONTINUED for r in report.runs)
    print(f"{report.sent} item events for cart-42, {report.duplicates} of them redelivered "
          f"and answered 'duplicate'; the cart continued as new {switches} time(s) on the "
          "way, carrying its lines")
    receipt = report.receipt
    print(f"checkout: {receipt.lines} lines, total {receipt.total_cents / 100:.2f} "
          f"(expected {report.expected_cents / 100:.2f})")
    print(f"an item after checkout opened cart run {report.reopened.run_id} "
          f"(started={report.reopened.started})")
    return report


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "shopping-cart.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    asyncio.run(main(target))

"""The shopping-cart example (`examples/shopping_cart.py`) runs and tells the truth."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

import corral
from example_modules import load_example
from procs import sql


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("shopping_cart.py", "shopping_cart_example")


async def test_the_cart_counts_each_item_once_continues_as_new_and_reopens_after_checkout(
    example: ModuleType, tmp_path: Path,
) -> None:
    store = tmp_path / "cart.db"
    report = await example.main(store, items=120)
    assert report.duplicates == report.sent - 120  # every redelivery, and only those
    assert report.receipt.lines == 120
    assert report.receipt.total_cents == report.expected_cents
    statuses = [r.status for r in report.runs]
    assert corral.RunStatus.CONTINUED in statuses  # a long cart continued as new
    assert statuses[-2:] == [corral.RunStatus.COMPLETED, corral.RunStatus.RUNNING]
    assert report.reopened.started
    assert report.reopened.run_id == len(report.runs)
    # The dedupe window is corral's: the entity keeps no set of seen item ids.
    assert not hasattr(example.Cart(example.CartInput(customer="x")), "seen")
    assert sql(str(store), "SELECT count(*) FROM dedupe WHERE key='cart-42'")[0][0] >= 121

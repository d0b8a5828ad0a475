"""The AI agent example (`examples/ai_agent.py`) runs and tells the truth: each model
and tool step ran once, the retried webhook was a duplicate, the refund reached the
tenant's `Escalation` once; and on Ray its model steps ran as Ray tasks."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from example_modules import load_example


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("ai_agent.py", "ai_agent_example")


async def test_the_agent_answers_each_reply_once_and_escalates_the_refund_once(
        example: ModuleType, db_path: str) -> None:
    example.CALLS.clear()
    report = await example.main(db_path)
    assert report.outcome.answers == [
        "Thanks for writing: 'My parcel #4411 never arrived, I want a refund' "
        "Order 4411 is delivered.",
        "Thanks for writing: \"Found it at the neighbour's, thanks!\""]
    assert report.outcome.escalated == 1
    assert [(c.ticket, c.order_id) for c in report.cases] == [("ticket-7", "4411")]
    assert report.calls == {"AiAgent/ticket-7/1/model:m-1": 1,
                            "AiAgent/ticket-7/1/tool:m-1": 1,
                            "AiAgent/ticket-7/1/model:m-2": 1}


@pytest.mark.usefixtures("ray_address")
async def test_on_ray_the_model_steps_run_as_ray_tasks(example: ModuleType,
                                                       tmp_path: Path) -> None:
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(example)  # the workers cannot import it by name
    example.CALLS.clear()
    report = await example.main(tmp_path / "ai.db", ray=True)
    assert report.outcome.escalated == 1
    assert report.calls == {"AiAgent/ticket-7/1/tool:m-1": 1}  # the model ran elsewhere

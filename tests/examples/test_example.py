"""The ticket-agent example (`examples/ticket_agent.py`) runs and tells the truth."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

import corral
from corral import RunStatus
from corral._demo import AGENT, TICKET_ID, WEBHOOKS, Assign, Reply, TicketAgent, on_customer_reply
from example_modules import load_example


@pytest.fixture(scope="module")
def example() -> ModuleType:
    """The example, loaded from its file (examples/ is not a package)."""
    return load_example("ticket_agent.py", "ticket_agent_example")


async def test_the_ticket_agent_answers_every_webhook_reply_once_in_timestamp_order(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = await example.main(tmp_path / "tickets.db")

    webhooks = [ev for ev, _ in report.deliveries]
    acks = [ack for _, ack in report.deliveries]
    unique = {ev.message_id: ev for ev in webhooks}
    assert len(unique) < len(webhooks), "the scenario must deliver duplicates"
    assert [ev.at for ev in webhooks] != sorted(ev.at for ev in webhooks), \
        "the scenario must deliver out of order"

    # Exactly one of the concurrent calls started the run; all went to that run.
    assert sum(ack.started for ack in acks) == 1
    assert {ack.run_id for ack in acks} == {1}

    # Per message id: the first delivery accepted, every retry a duplicate of it.
    by_id: dict[str, list[tuple[str, int]]] = {}
    for ev, ack in report.deliveries:
        by_id.setdefault(ev.message_id, []).append((ack.status, ack.seq))
    for message_id, answers in by_id.items():
        statuses = Counter(status for status, _ in answers)
        assert statuses == {"accepted": 1, "duplicate": len(answers) - 1}, message_id
        assert len({seq for _, seq in answers}) == 1, f"{message_id}: duplicate got a new seq"

    # Every unique reply answered exactly once, in the provider's timestamp order.
    outcome = report.outcome
    answered = [answer.reply for answer in outcome.answered]
    assert sorted(r.message_id for r in answered) == sorted(unique)
    assert [r.at for r in answered] == sorted(ev.at for ev in unique.values())
    assert answered[-1].closes_ticket
    assert outcome.resolved
    assert outcome.ticket == "ticket-9104"
    assert (report.waiting.waiting, report.waiting.answered) == (len(unique), 0)
    assert report.assigned.waiting == len(unique)
    assert report.description.status is RunStatus.COMPLETED
    assert report.description.accepted_seq == len(unique) + 1  # the replies and the update

    printed = capsys.readouterr().out
    assert f"{len(unique)} accepted, {len(webhooks) - len(unique)} duplicate" in printed
    assert printed.count("<- this call started the run") == 1


async def test_a_restarted_ticket_agent_answers_no_reply_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run() checkpoints after each answer, so a new host resumes after the last one."""
    drafted: list[str] = []  # the agent's effects, outside its state
    draft = TicketAgent._draft_answer

    def recording_draft(self: TicketAgent, reply: Reply) -> str:
        drafted.append(reply.message_id)
        return draft(self, reply)

    monkeypatch.setattr(TicketAgent, "_draft_answer", recording_draft)
    store = str(tmp_path / "tickets.db")
    early = {"msg-1", "msg-2", "msg-3"}

    async with corral.open_runtime(store, entities=[TicketAgent]) as rt:
        await asyncio.gather(*(on_customer_reply(rt, ev) for ev in WEBHOOKS
                               if ev.message_id in early))
        ticket = rt.ref(TicketAgent, f"ticket-{TICKET_ID}")
        await ticket.update(TicketAgent.assign, Assign(agent=AGENT), timeout=60)
        await _until_snapshot_holds_answers(rt, len(early))
    # That host is gone with the run still open; a new one takes its shards over.
    async with corral.open_runtime(store, entities=[TicketAgent]) as rt:
        acks = await asyncio.gather(*(on_customer_reply(rt, ev) for ev in WEBHOOKS))
        outcome = await rt.ref(TicketAgent, f"ticket-{TICKET_ID}").result(timeout=60)

    assert all(ack.status == "duplicate" for ev, ack in zip(WEBHOOKS, acks, strict=True)
               if ev.message_id in early)
    assert drafted == ["msg-1", "msg-2", "msg-3", "msg-4", "msg-5"]
    assert [a.reply.message_id for a in outcome.answered] == drafted


async def _until_snapshot_holds_answers(rt: corral.Runtime, count: int) -> None:
    """Poll the store until the agent's latest snapshot holds `count` answers."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        found = await rt.store.latest_snapshot(TicketAgent.__name__, f"ticket-{TICKET_ID}", 1)
        answered = len(json.loads(found[1])["state"]["answered"]) if found else 0
        if answered >= count:
            return
        assert asyncio.get_running_loop().time() < deadline, \
            f"the latest snapshot holds {answered} answers, never {count}"
        await asyncio.sleep(0.01)

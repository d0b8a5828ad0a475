"""Snapshots are JSON data validated against today's code, never pickles (issue 22).

The code-change tests leave an entity mid-life (a snapshot at seq 8, journal entries
9-13 after it, mailbox payloads `run()` has not taken) and open the same store with
the next release of its class (same type name), which must carry on with no code
beyond the change itself.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import corral
from corral.runtime.host._apply import ReplicaContext, instantiate
from corral.runtime.host._snapshot import capture
from stores import sql


class Start(BaseModel):
    owner: str


class Reply(BaseModel):
    body: str


class ReplyV2(BaseModel):  # the release adds an optional field
    body: str
    channel: str = "email"


class Ticket(corral.Entity):
    """Release 1: replies are noted in `inbox`; `customer_reply` fills the mailbox,
    which `run()` never drains (a backlog)."""

    name = "Ticket"
    snapshots = corral.SnapshotPolicy(every=8, keep=2)
    customer_reply = corral.signal(Reply)
    inbox: list[Reply]
    legacy: list[int]

    def __init__(self, init: Start) -> None:
        self.owner = init.owner
        self.inbox = []
        self.legacy = []
        self.answered = 0

    @corral.signal
    def note(self, reply: Reply) -> None:
        self.inbox.append(reply)
        self.legacy.append(len(self.inbox))
        self.answered += 1

    @corral.query
    def view(self) -> dict[str, Any]:
        return {"inbox": [r.body for r in self.inbox], "mailbox": len(self.mailbox)}


class TicketV2(corral.Entity):
    """Release 2: adds `priority` (set in `__init__`), an optional `channel` to the
    model, and drops `legacy`."""

    name = "Ticket"
    snapshots = corral.SnapshotPolicy(every=8, keep=2)
    customer_reply = corral.signal(ReplyV2)
    inbox: list[ReplyV2]

    def __init__(self, init: Start) -> None:
        self.owner = init.owner
        self.inbox = []
        self.answered = 0
        self.priority = "normal"

    @corral.signal
    def note(self, reply: ReplyV2) -> None:
        self.inbox.append(reply)
        self.answered += 1

    @corral.query
    def view(self) -> dict[str, Any]:
        return {
            "inbox": [[r.body, r.channel] for r in self.inbox],
            "mailbox": [[r.body, r.channel] for r, _ in self.mailbox.__getstate__()["items"]],
            "answered": self.answered, "priority": self.priority, "owner": self.owner,
            "has_legacy": hasattr(self, "legacy"),
        }


async def _mid_life(db_path: str) -> None:
    """Seq 1-8 applied and snapshotted by a host; seq 9-13 accepted with no host."""
    async with corral.open_runtime(db_path, entities=[Ticket]) as rt:
        ref = rt.ref(Ticket, "t-1")
        for n in range(8):
            handler = Ticket.note if n % 2 == 0 else Ticket.customer_reply
            await ref.signal_with_start(handler, Reply(body=f"r{n}"), start=Start(owner="ann"))
        assert (await ref.query(Ticket.view))["inbox"] == ["r0", "r2", "r4", "r6"]
    async with corral.open_runtime(db_path, entities=[Ticket], host=False) as rt:
        ref = rt.ref(Ticket, "t-1")
        for n in range(8, 13):
            handler = Ticket.note if n % 2 == 0 else Ticket.customer_reply
            await ref.signal(handler, Reply(body=f"r{n}"))
    assert sql(db_path, "SELECT max(applied_seq) FROM snapshots") == [(8,)]
    assert sql(db_path, "SELECT min(seq), max(seq) FROM journal WHERE seq > 8") == [(9, 13)]


async def test_a_snapshot_is_json_an_operator_can_read(db_path: str) -> None:
    await _mid_life(db_path)
    [(blob,)] = sql(db_path, "SELECT state FROM snapshots WHERE applied_seq = 8")
    envelope = json.loads(bytes(blob))
    assert (envelope["format"], envelope["state_version"]) == (1, 1)
    assert envelope["state"] == {
        "owner": "ann", "answered": 4, "legacy": [1, 2, 3, 4],
        "inbox": [{"body": f"r{n}"} for n in (0, 2, 4, 6)]}
    assert [(e["seq"], e["name"], json.loads(e["payload"])) for e in envelope["mailbox"]] == \
        [(n + 1, "customer_reply", {"body": f"r{n}"}) for n in (1, 3, 5, 7)]


async def test_a_release_adding_an_attribute_and_an_optional_field_and_dropping_one_carries_on(
        db_path: str) -> None:
    await _mid_life(db_path)
    async with corral.open_runtime(db_path, entities=[TicketV2]) as rt:
        ref = rt.ref(TicketV2, "t-1")
        await ref.signal(TicketV2.note, ReplyV2(body="r13", channel="sms"))
        view = await ref.query(TicketV2.view)
        info = await ref.describe()
    assert info.status is corral.RunStatus.RUNNING
    assert view == {
        # restored (default channel), replayed from the tail, then a new-release send
        "inbox": [[f"r{n}", "email"] for n in (0, 2, 4, 6, 8, 10, 12)] + [["r13", "sms"]],
        # the backlog from the snapshot and from the tail, rebuilt with today's model
        "mailbox": [[f"r{n}", "email"] for n in (1, 3, 5, 7, 9, 11)],
        "answered": 8, "priority": "normal", "owner": "ann", "has_legacy": False,
    }


async def test_a_hostile_snapshot_row_cannot_execute_code(db_path: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    await _mid_life(db_path)
    sql(db_path, "UPDATE snapshots SET state = ?", pickle.dumps(Exploit()))
    before = sql(db_path, "SELECT applied_seq, state FROM snapshots ORDER BY applied_seq")
    async with corral.open_runtime(db_path, entities=[Ticket], host=False) as rt:
        with pytest.raises(corral.PickledSnapshotError,
                           match=r"Ticket 't-1'.*seq 8.*never unpickles") as caught:
            await rt.ref(Ticket, "t-1").query(Ticket.view)
    assert (caught.value.entity_type, caught.value.key, caught.value.applied_seq) == \
        ("Ticket", "t-1", 8)
    assert not marker.exists()
    assert sql(db_path, "SELECT applied_seq, state FROM snapshots ORDER BY applied_seq") == before


class Holder(corral.Entity):
    def __init__(self) -> None:
        self.replies = [Reply(body="x")]  # a model, not annotated


class Strict(corral.Entity):
    count: int

    def __init__(self) -> None:
        self.count = 0


def test_an_attribute_that_is_not_plain_json_nor_annotated_is_named_at_the_first_snapshot(
        ) -> None:
    entity = instantiate(Holder._corral_definition, None, ReplicaContext("Holder", "h", 1))
    with pytest.raises(corral.SnapshotCaptureError,
                       match=r"attribute `replies` holds a list holding Reply.*annotate") as e:
        capture(Holder._corral_definition, entity)
    assert e.value.attribute == "replies"
    strict = instantiate(Strict._corral_definition, None, ReplicaContext("Strict", "s", 1))
    strict.count = "many"  # type: ignore[assignment]
    with pytest.raises(corral.SnapshotCaptureError, match=r"`count` does not encode") as e:
        capture(Strict._corral_definition, strict)
    assert e.value.attribute == "count"


def test_a_state_annotation_pydantic_cannot_encode_is_refused_when_the_class_is_defined(
        ) -> None:
    class Opaque:
        pass

    with pytest.raises(corral.EntityDefinitionError, match=r"Bad\.handle: pydantic cannot"):
        class Bad(corral.Entity):
            handle: Opaque

            def __init__(self) -> None:
                self.handle = Opaque()

"""`fairgate why` and `fairgate status` name a gang and where it was declared, with the
queue's own counts: "gang of Indexed Job trainer: 3 of 4 pods created, waiting for the
4th" (a real Redis, the real scripts; the source is what the webhook gives the queue)."""

from __future__ import annotations

import io
import json

import redis

from fairshare.cluster.cluster import PodRef
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import UNKNOWN_GANG_SIZE, GatedPod, PodRequest
from fairshare.status import (
    held_lines,
    render_why,
    status_command,
    status_report,
    why_report,
)
from tests.fairshare.simkit import make_config
from tests.fairshare.tickets import pod_uid

NOW = 1_700_000_000.0
CONFIG = make_config({"team-a": {"weight": 1, "nominal": {"gpu": 4}},
                      "team-b": {"weight": 1, "nominal": {"gpu": 4}}})
KEY = "job.trainer.1a2b3c4d5e"
GANG = f"team-a-dev/{KEY}"


def member(i: int, size: int = 4, source: str = "Indexed Job trainer",
           awaiting: str = "") -> PodRequest:
    return PodRequest(ticket=f"t{i}", tenant="team-a", namespace="team-a-dev",
                      name=f"trainer-{i}", pod_class="training", demand={"gpu": 1},
                      group=KEY, group_size=size, submitted_at=NOW + i,
                      group_source=source, group_awaiting=awaiting)


def admitted(q: FairQueue, req: PodRequest) -> None:
    assert q.admit(req, req.submitted_at).outcome == "queued"
    q.confirm(req.ticket, pod_uid(req.ticket), req.namespace, req.name)


def queue(client: redis.Redis, gpus: int = 8) -> FairQueue:
    q = FairQueue(client)
    q.sync_config(CONFIG, {"gpu": gpus})
    return q


def test_why_and_status_name_an_incomplete_gang_and_its_source(
        redis_client: redis.Redis, redis_url: str) -> None:
    q = queue(redis_client)
    for i in range(3):
        admitted(q, member(i))
    report = why_report(PodRef("team-a-dev", "trainer-1"), q, [], NOW + 10)
    assert report.verdict == "queued"
    assert report.summary == ("gang of Indexed Job trainer: 3 of 4 pods created, waiting for "
                              "the 4th; queued for team-a/training (3 queued)")
    assert report.waiting_for == ("the 4th pod of gang of Indexed Job trainer (3 of 4 pods "
                                  "created)")
    assert report.gang == {
        "id": GANG, "tenant": "team-a", "source": "Indexed Job trainer", "size": 4,
        "created": 3, "running": 0, "queued": 3, "awaiting": None,
        "summary": "gang of Indexed Job trainer: 3 of 4 pods created, waiting for the 4th"}
    text = io.StringIO()
    render_why(report, text)
    assert f"  gang: {GANG} (declared by Indexed Job trainer)\n" in text.getvalue()

    assert status_report(q, NOW + 10)["gangs"] == [report.gang]
    out = io.StringIO()
    assert status_command(redis_url, True, out=out) == 0
    assert json.loads(out.getvalue())["gangs"] == [report.gang]
    table = io.StringIO()
    assert status_command(redis_url, False, out=table) == 0
    assert (f"  team-a: gang of Indexed Job trainer: 3 of 4 pods created, waiting for the 4th "
            f"({GANG})") in table.getvalue()


def test_a_gang_of_unknown_size_says_what_its_size_waits_for(
        redis_client: redis.Redis) -> None:
    q = queue(redis_client)
    for i in range(2):
        admitted(q, member(i, UNKNOWN_GANG_SIZE, awaiting="Job trainer is seen"))
    report = why_report(PodRef("team-a-dev", "trainer-0"), q, [], NOW + 10)
    assert report.summary == (
        "gang of Indexed Job trainer: 2 pods created, waiting for its size (known once Job "
        "trainer is seen); queued for team-a/training (2 queued)")
    assert report.gang is not None and report.gang["size"] is None
    # the size arrives: the gang is complete and released whole
    assert q.resize({GANG: 2}) == 1
    assert status_report(q, NOW + 11)["gangs"] == []
    assert len(q.dispatch(NOW + 11, 5)) == 2


def test_a_complete_gang_says_what_it_waits_for_then_that_it_runs(
        redis_client: redis.Redis) -> None:
    q = queue(redis_client, gpus=2)
    for i in range(4):
        admitted(q, member(i))
    report = why_report(PodRef("team-a-dev", "trainer-3"), q, [], NOW + 10)
    assert report.summary == (
        "queued: position 1 of 4 for team-a/training, waiting for 2 x gpu of cluster "
        "capacity; gang of Indexed Job trainer: 4 of 4 pods created (released together)")
    assert status_report(q, NOW + 10)["gangs"] == []  # complete: not waiting for pods
    q.sync_config(CONFIG, {"gpu": 8})
    assert len(q.dispatch(NOW + 20, 5)) == 4
    running = why_report(PodRef("team-a-dev", "trainer-0"), q, [], NOW + 30)
    assert running.verdict == "running"
    assert running.summary.endswith(
        "; gang of Indexed Job trainer: 4 of 4 pods created, 4 running")


def test_held_capacity_names_the_gang_it_is_held_for(redis_client: redis.Redis) -> None:
    q = queue(redis_client, gpus=4)
    for i in range(2):  # team-b holds 2 of the 4 GPUs
        other = PodRequest(ticket=f"b{i}", tenant="team-b", namespace="team-b-dev",
                           name=f"b-{i}", pod_class="training", demand={"gpu": 1},
                           submitted_at=NOW)
        assert q.admit(other, NOW).outcome == "reserved"
        q.confirm(other.ticket, pod_uid(other.ticket), other.namespace, other.name)
    for i in range(4):
        admitted(q, member(i))
    held = status_report(q, NOW + 10)["held"]
    assert [(h["group"], h["gang"]["source"], h["gang"]["created"], h["held"])
            for h in held] == [(GANG, "Indexed Job trainer", 4, {"gpu": 2})]
    assert held_lines(held)[1] == (f"  team-a: 2 of 4 gpu held for gang of Indexed Job trainer "
                                   f"({GANG}, 4 pods; team-a-dev/trainer-0 first) (training)")


def test_a_rebuild_keeps_the_gangs_source(redis_client: redis.Redis) -> None:
    """The reconciler rebuilds the queue from the pods, which do not carry the source:
    the gangs it rebuilds keep the words stored before."""
    q = queue(redis_client)
    for i in range(2):
        admitted(q, member(i))
    gated = [GatedPod(member(i, source=""), "training", pod_uid(f"t{i}")) for i in range(2)]
    q.rebuild([], gated)
    (record,) = q.gangs([GANG])
    assert record is not None
    assert record.describe() == ("gang of Indexed Job trainer: 2 of 4 pods created, waiting "
                                 "for 2 more")


def test_a_gang_the_queue_was_not_told_the_source_of_is_named_by_its_id(
        redis_client: redis.Redis) -> None:
    q = queue(redis_client)
    admitted(q, member(0, source=""))
    report = why_report(PodRef("team-a-dev", "trainer-0"), q, [], NOW + 10)
    assert report.summary.startswith(f"gang {GANG}: 1 of 4 pods created, waiting for 3 more;")
    assert q.gangs(["team-a-dev/nothing"]) == [None]

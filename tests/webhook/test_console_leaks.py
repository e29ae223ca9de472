"""What a tenant viewer of the console can learn about other tenants: only what the
redacted records show. Real Redis, the real audit log and the console's own queries."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit import QUOTA_CHANGE, STREAM, AuditLog
from audit.chain import AuditRecord
from fairshare.queue.fairqueue import FairQueue
from tenants.localdir import load_config_dir, write_config_dir
from webhook.console.access import HIDDEN, Redactor, Viewer
from webhook.console.data import ConsoleData, search_text
from webhook.console.events import Broadcaster
from webhook.console.history import FairnessHistory
from webhook.console.namespaces import NamespaceIndex

PLATFORM = """\
capacity: {gpu: 8}
tenants:
  team-a: {weight: 1, ceiling: {gpuEquivalents: 8}}
  team-b: {weight: 1, ceiling: {gpuEquivalents: 8}}
  zeta: {weight: 1, ceiling: {gpuEquivalents: 8}}
"""
# team-a's namespace "lab" and zeta's "kiwi" do not spell their tenant's name.
NAMESPACES = ("team-a-dev: {fairgate.io/tenant: team-a}\nlab: {fairgate.io/tenant: team-a}\n"
              "team-b-dev: {fairgate.io/tenant: team-b}\nkiwi: {fairgate.io/tenant: zeta}\n")
OWN = {"team-a": ("team-a-dev", "lab"), "team-b": ("team-b-dev",), "zeta": ("kiwi",)}
TEAM_B = Viewer("team-b-admin", tenants=frozenset({"team-b"}))
# What another tenant owns: nothing of it may reach team-b's admin.
SECRETS = ("team-a", "zeta", "lab", "kiwi", "p-secret")

WORDS = ("held", "for", "capacity", "queued:", "gpu", "nvidia.com/gpu", "team-b/training",
         "team-b-dev/b-1", "team-a-dev/a-0", "lab/p-secret", "kiwi/k-1", "team-a",
         "zeta", "lab", "kiwi", "team-a/training", "nobody/pod", "(x)", "2", "of")


@pytest.fixture
def console(redis_url: str, tmp_path: Path) -> Iterator[tuple[redis.Redis, ConsoleData]]:
    """A console's queries over the emptied Redis: three tenants known, the config's
    namespace labels, a scanned namespace index."""
    client = redis.Redis.from_url(redis_url)
    client.sadd("fairgate:tenants", *OWN)
    config = load_config_dir(write_config_dir(tmp_path / "config", PLATFORM, {}, NAMESPACES))
    queue = FairQueue(client)
    index = NamespaceIndex(client, queue, STREAM)
    index.scan()
    data = ConsoleData(client, queue, FairnessHistory(client, queue), lambda: config,
                       namespaces=index)
    yield client, data
    client.close()


def _write(client: redis.Redis, records: list[AuditRecord]) -> None:
    for key in client.scan_iter("fairgate:audit*"):
        client.delete(key)
    if records:
        AuditLog(client).record_many(records)


reasons = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
PODS = {"team-a": ("a-0", "p-secret"), "team-b": ("b-1", "b-2")}
records = st.builds(
    lambda pod, decision, reason, diff: AuditRecord(
        decision, tenant=pod[0], namespace=OWN[pod[0]][0], name=pod[1], reason=reason,
        user=f"{pod[0]}-user", diff=({"nominal": {"old": diff, "new": "gpu"}}
                                     if decision == QUOTA_CHANGE else None)),
    st.sampled_from([(t, n) for t, names in PODS.items() for n in names]),
    st.sampled_from(["admit", "queue", "deny", QUOTA_CHANGE]), reasons, reasons)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stored=st.lists(records, max_size=12), data=st.data())
def test_a_search_matches_exactly_the_shown_records_that_contain_it(
        console: tuple[redis.Redis, ConsoleData], stored: list[AuditRecord],
        data: st.DataObject) -> None:
    """For any query (hidden words, pieces of stored raw text, the redaction mark), the
    records found are exactly the shown (redacted) records that contain it: a function
    of what the viewer is shown, so no query tells it a word it is not shown."""
    client, console_data = console
    _write(client, stored)
    shown = console_data.audit(TEAM_B)["records"]
    raw = [json.dumps(r.fields()) for r in stored]
    pieces = st.sampled_from(raw).flatmap(
        lambda text: st.tuples(st.integers(0, len(text)), st.integers(1, 24)).map(
            lambda cut: text[cut[0]:cut[0] + cut[1]])) if raw else st.just("x")
    queries = [data.draw(st.one_of(pieces, st.sampled_from(WORDS + SECRETS + (HIDDEN,)),
                                   st.text("abcdeiklmnptz-/ ", max_size=8)))
               for _ in range(4)]
    assert not any(s in json.dumps(shown) for s in SECRETS), shown
    for q in queries:
        found = console_data.audit(TEAM_B, q=q)["records"]
        assert found == [r for r in shown if q.lower().encode() in search_text(r)], q


def test_searching_a_hidden_tenant_name_finds_nothing(
        console: tuple[redis.Redis, ConsoleData]) -> None:
    """The attack: the reason is shown as "held for (another tenant)"; searching the
    hidden word or a guess of it finds no more than searching a wrong guess."""
    client, data = console
    _write(client, [AuditRecord("queue", tenant="team-b", namespace="team-b-dev",
                                name="b-1", reason="held for team-a-dev/a-0 of lab")])
    [record] = data.audit(TEAM_B)["records"]
    assert record["reason"] == f"held for {HIDDEN} of {HIDDEN}"
    for guess in ("held for team-a", "held for t", "team-a-dev", "of lab", "a-0"):
        assert data.audit(TEAM_B, q=guess)["records"] == [], guess
    assert data.audit(TEAM_B, q=f"for {HIDDEN}")["records"] == [record]
    platform = data.audit(Viewer("admin", everything=True), q="held for team-a")["records"]
    assert [r["reason"] for r in platform] == ["held for team-a-dev/a-0 of lab"]


def test_another_tenants_namespaces_and_pods_are_hidden_in_every_free_text_field() -> None:
    owners = {"team-a-dev": frozenset({"team-a"}), "lab": frozenset({"team-a"}),
              "team-b-dev": frozenset({"team-b"})}
    redactor = Redactor(TEAM_B, ["team-a", "team-b"], owners.get)
    assert redactor.text("capacity held for lab/p-1 (training)") == \
        f"capacity held for {HIDDEN} (training)"
    assert redactor.text("namespace lab is full") == f"namespace {HIDDEN} is full"
    assert redactor.text("pod nowhere/p-2 waits") == f"pod {HIDDEN} waits"  # unknown: hidden
    kept = "queued: 1 of 2 for team-b/training, team-b-dev/b-1 asks 1 nvidia.com/gpu"
    assert redactor.text(kept) == kept
    assert redactor.value({"lab": {"old": ["team-a-dev/x", 2], "new": "ok"}}) == \
        {HIDDEN: {"old": [HIDDEN, 2], "new": "ok"}}
    everything = Redactor(Viewer("admin", everything=True), ["team-a"], owners.get)
    assert everything.text("held for lab/p-1") == "held for lab/p-1"


def test_the_event_stream_hides_another_tenants_namespace_and_pod(
        console: tuple[redis.Redis, ConsoleData]) -> None:
    client, data = console
    events = Broadcaster(client, STREAM, data.queue.tenant_names, redactor=data.redactor)

    async def watch() -> list[str]:
        stream = events.subscribe(TEAM_B)
        assert await anext(stream) == ": connected\n\n"
        events.publish("decision", {"tenant": "team-b", "pod": "team-b-dev/b-1",
                                    "reason": "held for lab/p-secret in kiwi"}, "team-b")
        seen = [await anext(stream)]
        await stream.aclose()
        return seen

    seen = asyncio.run(watch())
    assert "team-b-dev/b-1" in seen[0]
    assert not any(s in seen[0] for s in SECRETS), seen
    assert seen[0].count(HIDDEN) == 2



def test_event_stream_clients_are_capped_overall_and_per_user(
        console: tuple[redis.Redis, ConsoleData]) -> None:
    client, data = console
    events = Broadcaster(client, STREAM, data.queue.tenant_names, max_clients=5,
                         max_per_viewer=2)

    async def crowd() -> tuple[list[str], str | None, str | None]:
        streams = [events.subscribe(Viewer(f"user-{i // 2}", everything=True))
                   for i in range(6)]
        first = [await anext(stream) for stream in streams]
        overall = events.refusal(Viewer("someone", everything=True))
        await streams[2].aclose()  # one of user-1's: 4 open, user-0 still has 2
        third = events.subscribe(Viewer("user-0", everything=True))
        first.append(await anext(third))
        per_user = events.refusal(Viewer("user-0", everything=True))
        for stream in [*streams, third]:
            await stream.aclose()
        return first, per_user, overall

    first, per_user, overall = asyncio.run(crowd())
    assert first[:5] == [": connected\n\n"] * 5
    assert first[5].startswith("event: refused") and "at most 5" in first[5]
    assert first[6].startswith("event: refused")
    assert per_user is not None and "user-0 has 2" in per_user
    assert overall is not None and "at most 5" in overall
    assert events.clients == 0
    assert events.refusal(Viewer("user-0", everything=True)) is None

"""The hash chain: records, canonical form, and verify() locating tampering."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.chain import GENESIS, AuditRecord, ChainHead, chain_hash, verify
from audit.log import AuditLog

CHAIN_LENGTH = 10_000


def _chain(n: int) -> list[AuditRecord]:
    log = AuditLog(None, out=io.StringIO())
    return [
        log.record("admit" if i % 3 else "queue", uid=f"uid-{i}", user="alice@example.com",
                   groups=("team-a-admins", "system:authenticated"), operation="CREATE",
                   tenant=f"team-{i % 4}", namespace="ns", name=f"pod-{i}",
                   pod_class="training", demand="gpu=1", reason="fits nominal",
                   latency_ms=i / 7)
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def chain() -> list[AuditRecord]:
    return _chain(CHAIN_LENGTH)


def _head(records: list[AuditRecord]) -> ChainHead:
    last = records[-1]
    assert last.seq is not None and last.hash is not None
    return ChainHead(last.seq, last.hash)


def test_chain_of_ten_thousand_verifies(chain: list[AuditRecord]) -> None:
    result = verify(chain, _head(chain))
    assert result.ok, result.problem
    assert (result.checked, result.first_seq, result.last_seq) == (CHAIN_LENGTH, 1, CHAIN_LENGTH)
    assert chain[0].prev == GENESIS
    assert all(b.prev == a.hash for a, b in itertools.pairwise(chain))


def test_wire_form_is_canonical_and_round_trips(chain: list[AuditRecord]) -> None:
    line = chain[5].to_json()
    data = json.loads(line)
    assert line == json.dumps(data, sort_keys=True, separators=(",", ":"))
    assert data["class"] == "training" and "pod_class" not in data
    assert data["hash"] == chain_hash(data)
    assert AuditRecord.from_json(line) == chain[5]
    assert data["time"].endswith("Z")


def test_record_only_has_the_listed_fields() -> None:
    with pytest.raises(TypeError):
        AuditRecord(decision="admit", env={"TOKEN": "secret"})  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="unknown keys"):
        AuditRecord.from_json('{"decision":"admit","spec":{"containers":[]}}')


def test_bad_decision_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="quota-change"):
        AuditRecord(decision="Admit!")


@settings(max_examples=25, deadline=None)
@given(index=st.integers(0, CHAIN_LENGTH - 1), field=st.sampled_from(["decision", "tenant"]))
def test_an_edited_record_is_located(chain: list[AuditRecord], index: int, field: str) -> None:
    tampered = list(chain)
    tampered[index] = dataclasses.replace(chain[index], **{field: "deny"})
    result = verify(tampered, _head(chain))
    assert not result.ok
    assert (result.first_bad, result.position) == (index + 1, index)
    assert "edited" in result.problem


@settings(max_examples=25, deadline=None)
@given(index=st.integers(0, CHAIN_LENGTH - 2))
def test_an_edit_with_a_recomputed_hash_is_located(chain: list[AuditRecord], index: int) -> None:
    tampered = list(chain)
    forged = dataclasses.replace(chain[index], reason="nothing to see", hash=None)
    tampered[index] = dataclasses.replace(forged, hash=chain_hash(forged.fields()))
    result = verify(tampered, _head(chain))
    assert not result.ok
    assert result.first_bad == index + 1
    assert "replaced" in result.problem


def test_an_edited_last_record_with_recomputed_hash_is_caught_by_the_head(
    chain: list[AuditRecord],
) -> None:
    tampered = list(chain)
    forged = dataclasses.replace(chain[-1], decision="admit", hash=None)
    tampered[-1] = dataclasses.replace(forged, hash=chain_hash(forged.fields()))
    result = verify(tampered, _head(chain))
    assert not result.ok and result.first_bad == CHAIN_LENGTH


@settings(max_examples=25, deadline=None)
@given(index=st.integers(1, CHAIN_LENGTH - 1))
def test_a_deleted_record_is_located(chain: list[AuditRecord], index: int) -> None:
    tampered = chain[:index] + chain[index + 1:]
    result = verify(tampered, _head(chain))
    assert not result.ok
    assert result.first_bad == index + 1
    assert "missing" in result.problem


def test_deleting_the_first_record_is_caught_by_the_floor(chain: list[AuditRecord]) -> None:
    result = verify(chain[1:], _head(chain))
    assert not result.ok and result.first_bad == 1 and "missing" in result.problem


def test_without_a_head_the_first_record_is_the_trusted_anchor(chain: list[AuditRecord]) -> None:
    assert verify(chain[1:]).ok


@settings(max_examples=25, deadline=None)
@given(index=st.integers(0, CHAIN_LENGTH - 2))
def test_swapped_records_are_located(chain: list[AuditRecord], index: int) -> None:
    tampered = list(chain)
    tampered[index], tampered[index + 1] = tampered[index + 1], tampered[index]
    result = verify(tampered, _head(chain))
    assert not result.ok
    assert (result.first_bad, result.position) == (index + 1, index)
    assert "out of order" in result.problem


def test_a_record_moved_to_the_end_is_located(chain: list[AuditRecord]) -> None:
    tampered = [*chain[:100], *chain[101:], chain[100]]
    result = verify(tampered, _head(chain))
    assert not result.ok and result.first_bad == 101 and "out of order" in result.problem


def test_a_replayed_record_is_located(chain: list[AuditRecord]) -> None:
    tampered = [*chain[:50], chain[40], *chain[50:]]
    result = verify(tampered, _head(chain))
    assert not result.ok and result.first_bad == 51 and "twice" in result.problem


def test_removed_tail_is_caught_by_the_head(chain: list[AuditRecord]) -> None:
    result = verify(chain[:-3], _head(chain))
    assert not result.ok
    assert result.first_bad == CHAIN_LENGTH - 2 and result.position is None
    assert "from the end" in result.problem


def test_retention_floor_allows_trimmed_start(chain: list[AuditRecord]) -> None:
    head = dataclasses.replace(_head(chain), floor=CHAIN_LENGTH - 99)
    assert verify(chain[-100:], head).ok
    result = verify(chain[-99:], head)
    assert not result.ok and result.first_bad == CHAIN_LENGTH - 99


def test_all_records_removed_is_reported() -> None:
    result = verify([], ChainHead(3, "ab" * 32))
    assert not result.ok and "removed" in result.problem
    assert verify([]).ok

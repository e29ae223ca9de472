"""The queue's Lua as one Redis Function library (fairshare/queue/functions.py), on real
redis-servers: loaded again whenever Redis lacks it, kept by FLUSHALL and replicas, one
library per fairgate version, per-call state cleared between calls, the ACL it needs."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import uuid
from importlib import resources
from typing import Any

import pytest
import redis
import redis.asyncio

from fairshare.queue.calls import LIB_PARTS, OPERATIONS, READ_ONLY, Library, lib_source, library
from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.fastpath import AsyncFairQueue
from fairshare.queue.functions import LibraryLoadError, QueueFunctions
from fairshare.queue.model import GatedPod, PodRequest, RunningPod
from tenants.models import FairgateConfig, PlatformConfig, QuotaSpec
from tests.fairshare.queue.test_queue import Pods, config, queue_with
from tests.fairshare.tickets import pod_uid, seen

CAPACITY = {"gpu": 4, "mig-1g.5gb": 4}
TENANTS: dict[str, dict[str, Any]] = {
    "a": {"nominal": {"gpu": 2}, "borrow": 1, "weight": 2},
    "b": {"nominal": {"gpu": 2, "mig-1g.5gb": 2}},
}


def _loads(client: redis.Redis) -> int:
    """How many FUNCTION LOADs the server ran since its stats were reset."""
    stats = client.info("commandstats").get("cmdstat_function|load", {})
    return int(stats.get("calls", 0))


def _fields(flat: list[Any]) -> dict[str, Any]:
    """A FUNCTION LIST entry (a flat name, value, ... list) as a dict."""
    return {name.decode(): value for name, value in zip(flat[::2], flat[1::2], strict=True)}


def _libraries(client: redis.Redis) -> set[str]:
    return {_fields(entry)["library_name"].decode() for entry in client.function_list()}


def _version(name: str, **edits: str) -> Library:
    """This library under another name (another fairgate version), with text edits."""
    source = library().source.replace(library().name, name)
    for old, new in edits.items():
        assert old in source, old
        source = source.replace(old, new)
    return Library(name, source)


# -- per-call state -------------------------------------------------------------------


def _lua(name: str) -> str:
    text = resources.files("fairshare.queue.scripts").joinpath(f"{name}.lua").read_text()
    return re.sub(r"--.*", "", text)  # comments out


def test_every_lib_local_an_operation_changes_is_cleared_before_each_call() -> None:
    """The shared helpers (lib_<part>.lua) ran before every script call; in the library
    they run once per prefix, so any of their top-level locals an operation assigns or
    fills (a cache, the clock) would leak into the next call unless `begin` clears it."""
    lib = re.sub(r"--.*", "", lib_source())
    names = {n.strip() for m in re.finditer(r"^local (?!function)([\w, ]+?)\s*=", lib, re.M)
             for n in m.group(1).split(",")}
    code = lib + "".join(_lua(op) for op in OPERATIONS)
    changed = {name for name in names
               if re.search(rf"^(?!\s*local\b).*(?<![\w.]){name}\s*(\[[^\]\n]*\])?\s*=(?!=)",
                            code, re.M)}
    assert {"CFG", "USED", "CAP", "NOW", "HL", "CAP_SLICES", "SHAPES"} <= changed
    frame = _lua("library")
    begin = frame[frame.index("local function begin()"):]
    begin = begin[:begin.index("\nend\n")]
    cleared = {n.strip() for m in re.finditer(r"([A-Za-z_]\w*(?:\s*,\s*\w+)*)\s*=(?!=)", begin)
               for n in m.group(1).split(",")}
    assert changed <= cleared, f"clear {sorted(changed - cleared)} in library.lua begin()"


def _contents(client: redis.Redis) -> dict[str, Any]:
    """Every key's type and value, in a comparable form."""
    out: dict[str, Any] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind == "string":
            value: Any = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(client.smembers(key))
        else:
            value = client.zrange(key, 0, -1, withscores=True)
        out[key.decode()] = (kind, value)
    return out


def _workload_config(rng: random.Random, half_life: str) -> FairgateConfig:
    platform = PlatformConfig.model_validate({
        "tenants": {t: {"weight": rng.choice([1, 2, 3]), "ceiling": {"gpuEquivalents": 100}}
                    for t in ("a", "b", "c")},
        "fairShare": {"usageHalfLife": half_life},
    })
    quotas = {t: QuotaSpec.model_validate({
        "nominal": {"gpu": rng.choice([2, 3, 4]), "mig-1g.5gb": rng.choice([2, 4])},
        "borrowLimit": {"gpuEquivalents": rng.choice([0, 1, 2])},
        "inferenceReserve": {"gpuEquivalents": rng.choice([0, 1])}}) for t in ("a", "b", "c")}
    return FairgateConfig(platform=platform, quotas=quotas)


def _step(q: FairQueue, rng: random.Random, state: dict[str, Any], step: int) -> Any:
    """One random operation on ``q`` (``rng`` and ``state`` replayed identically on the
    reference queue); its answer, or its error as text."""
    now = float(step)
    admitted: list[PodRequest] = state["admitted"]
    kind = rng.choice(["admit"] * 5 + ["confirm"] * 2 + ["dispatch"] * 2 + [
        "release", "remove", "requeue", "expire", "sync", "why", "holds", "snapshot",
        "find", "rebuild"])
    try:
        if kind == "admit":
            tenant = rng.choice("abc")
            gang = rng.random() < 0.25
            # every other ticket a uuid, as fairgate mints them (stored packed)
            ticket = f"t{step}" if step % 2 else str(uuid.UUID(int=step))
            req = PodRequest(
                ticket=ticket, tenant=tenant, namespace=f"ns-{tenant}", name=f"p{step}",
                pod_class="inference" if rng.random() < 0.15 else "training",
                demand=rng.choice([{"gpu": 1}, {"gpu": 2}, {"mig-1g.5gb": 1}, {"gpu": 4}]),
                group=f"g{rng.randrange(4)}-{tenant}" if gang else None,
                group_size=rng.choice([2, 3]) if gang else 1, submitted_at=now)
            admitted.append(req)
            return q.admit(req, now, dry_run=rng.random() < 0.1)
        if kind == "sync":
            return q.sync_config(_workload_config(rng, state["half_life"]),
                                 rng.choice([None, {"gpu": 6, "mig-1g.5gb": 6}, CAPACITY]))
        if kind == "dispatch":
            return q.dispatch(now, rng.randint(1, 3))
        if kind == "expire":
            return q.expire(now)
        if kind == "holds":
            return q.holds(now)
        if kind == "snapshot":
            return q.snapshot()
        if not admitted:
            return None
        req = rng.choice(admitted)
        if kind == "confirm":
            return seen(q, req)
        if kind == "release":
            return q.release(req.ticket, pod_uid(req.ticket), now)
        if kind == "remove":
            return q.remove(req.ticket, pod_uid(req.ticket), now)
        if kind == "requeue":
            return q.requeue(req.ticket, now)
        if kind == "why":
            return q.ticket_statuses([req.ticket, "nope"], now)
        if kind == "find":
            return q.find(req.namespace, req.name)
        # rebuild from a sample of the admitted pods: some running, some gated
        sample = rng.sample(admitted, min(4, len(admitted)))
        return q.rebuild(
            [RunningPod(ticket=r.ticket, tenant=r.tenant, namespace=r.namespace, name=r.name,
                        pod_class=r.pod_class, band="training", demand=r.demand,
                        uid=pod_uid(r.ticket)) for r in sample[:2] if not r.group],
            [GatedPod(request=r, band="training", uid=pod_uid(r.ticket)) for r in sample[2:]],
            listed_at=now)
    except (redis.ResponseError, ValueError, LookupError) as error:
        return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("half_life", ["0s", "10m"])
def test_a_kept_library_answers_as_one_made_afresh_for_every_call(
    redis_url: str, half_life: str
) -> None:
    """The shipped library (the lib_<part>.lua helpers once per prefix, parse_shape's
    cache kept and emptied every 1,000 calls) against the same code made afresh on every
    call, as EVALSHA ran it: the same answers and the same Redis contents over 1,300
    random operations of every kind, config changes included."""
    fresh = _version("fairgate_fresh_each_call",  # never finds a kept instance
                     **{"local ops = instances[prefix]": "local ops = nil"})
    kept_client = redis.Redis.from_url(redis_url)
    fresh_client = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/1")  # database 1
    queues = []
    for client, lib in ((kept_client, None), (fresh_client, fresh)):
        q = FairQueue(client, reservation_ttl=40.0)
        q._functions = QueueFunctions(client, "fairgate:", lib)  # the library under test
        q.sync_config(_workload_config(random.Random(7), half_life), CAPACITY)
        queues.append(q)
    states = [{"admitted": [], "half_life": half_life} for _ in queues]
    rngs = [random.Random(half_life), random.Random(half_life)]
    for step in range(1, 1300):
        answers = [_step(q, rng, state, step)
                   for q, rng, state in zip(queues, rngs, states, strict=True)]
        assert answers[0] == answers[1], f"step {step}"
        if step % 100 == 0:
            assert _contents(kept_client) == _contents(fresh_client), f"step {step}"
    assert len(states[0]["admitted"]) > 300
    assert _contents(kept_client) == _contents(fresh_client)


def test_each_prefix_keeps_its_own_state_beyond_the_kept_instances(
    redis_client: redis.Redis, pods: Pods
) -> None:
    """20 prefixes (more than the 16 instances kept) used in turn: each sees only its
    own keys, whether its instance was kept or made again."""
    queues = [FairQueue(redis_client, prefix=f"p{i}:") for i in range(20)]
    for i, q in enumerate(queues):
        q.sync_config(config(a={"nominal": {"gpu": i + 2}}), {"gpu": 100})
    for _ in range(2):
        for q in queues:
            assert q.admit(pods("a"), 1.0).outcome == "reserved"
    for i, q in enumerate(queues):
        [status] = q.tenant_status()
        assert (status.nominal, status.used) == ({"gpu": i + 2}, {"gpu": 2})


@pytest.fixture
def pods() -> Pods:
    return Pods()


# -- loading ----------------------------------------------------------------------------


def test_a_flushed_library_is_loaded_again_by_the_next_call(
    redis_client: redis.Redis, pods: Pods
) -> None:
    """FUNCTION FLUSH (as a Redis restarted empty) before each kind of call: the call
    loads the library once and answers; nothing is loaded while it is there."""
    q = queue_with(redis_client, CAPACITY, **TENANTS)
    first = pods("a")
    assert q.admit(first, 1.0).outcome == "reserved"
    redis_client.config_resetstat()
    calls = [
        lambda: q.admit(pods("b"), 2.0).outcome,  # a writing operation
        lambda: q.tenant_status()[0].used,  # read-only: FCALL_RO
        lambda: q.snapshot().capacity,  # two read-only calls in MULTI/EXEC
        lambda: [s and s.state for s in q.ticket_statuses([first.ticket], 3.0)],  # pipeline
    ]
    expected = ["reserved", {"gpu": 1}, CAPACITY, ["reserved"]]
    for n, (call, answer) in enumerate(zip(calls, expected, strict=True), start=1):
        redis_client.function_flush()
        assert call() == answer
        assert _loads(redis_client) == n
        assert call() is not None and _loads(redis_client) == n  # loaded: no second load
    assert _libraries(redis_client) == {library().name}


def test_the_webhook_queue_loads_the_flushed_library_too(redis_url: str, pods: Pods) -> None:
    async def run() -> tuple[str, str]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            queue = AsyncFairQueue(client)
            await client.function_flush()
            await queue.sync_config(config(**TENANTS), CAPACITY)
            await client.function_flush()
            first = (await queue.admit(pods("a"), 1.0)).outcome
            await client.function_flush()
            return first, (await queue.tenant_status())[0].tenant
        finally:
            await client.aclose()

    assert asyncio.run(run()) == ("reserved", "a")


def test_a_burst_of_webhook_calls_that_find_the_library_missing_loads_it_once(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """After a Redis restart every decision in flight finds the library missing: one
    load (each holds Redis for milliseconds), not one per decision."""
    big = {"a": {"nominal": {"gpu": 64}}}

    async def run() -> list[str]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            queue = AsyncFairQueue(client)
            await queue.sync_config(config(**big), {"gpu": 64})
            await asyncio.gather(*(client.ping() for _ in range(32)))  # 32 open connections
            await client.function_flush()
            await client.config_resetstat()
            pods = Pods()
            answers = await asyncio.gather(*(queue.admit(pods("a"), 1.0) for _ in range(32)))
            return [a.outcome for a in answers]
        finally:
            await client.aclose()

    assert asyncio.run(run()) == ["reserved"] * 32
    assert _loads(redis_client) == 1
    calls = redis_client.info("commandstats")["cmdstat_fcall"]
    assert calls["failed_calls"] > 1  # they did find it missing together


def test_a_replica_gets_the_library_and_serves_the_read_only_operations(
    primary_and_replica: tuple[str, redis.Redis], pods: Pods
) -> None:
    """Functions replicate (so a promoted replica has them); the read-only operations are
    `no-writes` functions, which a replica runs (FCALL_RO)."""
    primary, replica = primary_and_replica
    request = pods("a")

    async def admit() -> str:
        client = redis.asyncio.Redis.from_url(primary)
        try:
            queue = AsyncFairQueue(client, replicas=1, replica_timeout=2.0)
            await client.function_flush()
            await queue.sync_config(config(**TENANTS), CAPACITY)
            await client.function_flush()  # the admission (with WAIT) loads it again
            return (await queue.admit(request, 1.0)).outcome
        finally:
            await client.aclose()

    assert asyncio.run(admit()) == "reserved"
    assert _libraries(replica) == {library().name}
    on_replica = FairQueue(replica)
    assert [s.used for s in on_replica.tenant_status()] == [{"gpu": 1}, {}]
    status = on_replica.ticket_status(request.ticket, 2.0)
    assert status is not None and status.state == "reserved"
    assert on_replica.holds(2.0) == []
    with pytest.raises(redis.ReadOnlyError):
        on_replica.admit(pods("a"), 2.0)


def test_flushall_keeps_the_library(redis_client: redis.Redis, pods: Pods) -> None:
    q = queue_with(redis_client, CAPACITY, **TENANTS)
    redis_client.flushall()
    redis_client.config_resetstat()
    q.sync_config(config(**TENANTS), CAPACITY)
    assert q.admit(pods("a"), 1.0).outcome == "reserved"
    assert _loads(redis_client) == 0


def test_two_versions_run_side_by_side_without_unloading_each_other(
    redis_client: redis.Redis, pods: Pods
) -> None:
    """A rolling upgrade: the old and the new fairgate call one Redis in turn. Each has
    its own library; neither loads again once both are there."""
    old = _version("fairgate_0123456789abcdef")
    old_queue = FairQueue(redis_client, prefix="fairgate:")
    old_queue._functions = QueueFunctions(redis_client, "fairgate:", old)  # the old version
    roomy = {"a": {"nominal": {"gpu": 5}}, "b": {"nominal": {"gpu": 5}}}
    new_queue = queue_with(redis_client, {"gpu": 10}, **roomy)
    old_queue.sync_config(config(**roomy), {"gpu": 10})
    assert _libraries(redis_client) == {library().name, old.name}
    redis_client.config_resetstat()
    for _ in range(5):
        assert old_queue.admit(pods("a"), 1.0).outcome == "reserved"
        assert new_queue.admit(pods("b"), 1.0).outcome == "reserved"
    assert _loads(redis_client) == 0
    assert [s.used_slices for s in new_queue.tenant_status()] == [35, 35]


def test_a_user_that_may_not_load_the_library_is_told_what_to_grant(
    redis_url: str, redis_client: redis.Redis, pods: Pods
) -> None:
    redis_client.acl_setuser("fgtest", enabled=True, passwords=["+pw"], keys=["*"],
                             channels=["*"], commands=["+@all", "-function|load"])
    try:
        limited = redis.Redis.from_url(redis_url, username="fgtest", password="pw")
        redis_client.function_flush()
        q = FairQueue(limited)
        with pytest.raises(LibraryLoadError, match=r"\+function\|load"):
            q.sync_config(config(**TENANTS), CAPACITY)
        # fairgate status as that user: the same words, no traceback, no password
        user_url = redis_url.replace("redis://", "redis://fgtest:pw@")
        done = subprocess.run([sys.executable, "-m", "webhook.cli", "status", "--redis-url",
                               user_url], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert "+fcall +fcall_ro +function|load" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and ":pw@" not in done.stderr
        queue_with(redis_client, CAPACITY, **TENANTS)  # loaded by a user who may
        assert q.admit(pods("a"), 1.0).outcome == "reserved"
        limited.close()
    finally:
        redis_client.acl_deluser("fgtest")


def test_read_only_operations_may_not_write(redis_client: redis.Redis) -> None:
    """The no-writes flag is on exactly the read-only operations: Redis refuses a
    read-only function that writes, and FCALL_RO of a writing one."""
    FairQueue(redis_client).tenant_status()  # loads it
    [entry] = redis_client.function_list(library().name)
    functions = [_fields(f) for f in _fields(entry)["functions"]]
    flags = {f["name"].decode().rsplit("_", 1)[1]: {x.decode() for x in f["flags"]}
             for f in functions}
    assert {op for op, f in flags.items() if "no-writes" in f} == READ_ONLY
    with pytest.raises(redis.ResponseError, match="write flag"):
        redis_client.fcall_ro(library().function("admit"), 1, "fairgate:")


def test_a_call_without_the_prefix_key_is_refused_clearly(redis_client: redis.Redis) -> None:
    FairQueue(redis_client).tenant_status()  # loads it
    with pytest.raises(redis.ResponseError, match="needs the key prefix as its one key"):
        redis_client.fcall_ro(library().function("status"), 0)


def test_every_helper_file_is_a_part_of_the_library() -> None:
    """A lib_<part>.lua left out of LIB_PARTS would be shipped and never loaded."""
    files = {path.name for path in resources.files("fairshare.queue.scripts").iterdir()
             if path.name.startswith("lib_") and path.name.endswith(".lua")}
    assert files == {f"lib_{part}.lua" for part in LIB_PARTS}

"""The Fairness page's charts: a time axis on every chart, one y-scale for all tenants and
a line that ends at 0 when a tenant goes idle (``fairgate demo``'s run charted:
tests/webhook/test_first_run.py)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import redis
from webhook_helpers import write_config

from fairshare.queue.fairqueue import FairQueue
from fairshare.queue.model import PodRequest
from tenants.localdir import load_config_dir
from webhook.console.charts import WIDTH, line_chart, shared_top, time_ticks
from webhook.console.history import FairnessHistory


def test_the_time_axis_spans_the_window_in_utc() -> None:
    since = datetime(2026, 3, 1, 6, 0, tzinfo=UTC).timestamp()
    marks = time_ticks(since, since + 6 * 3600)
    assert [label for _, label, _ in marks] == ["06:00", "07:30", "09:00", "10:30", "12:00"]
    assert [anchor for _, _, anchor in marks] == ["start", "middle", "middle", "middle", "end"]
    xs = [x for x, _, _ in marks]
    assert xs == sorted(xs) and xs[-1] == WIDTH
    week = time_ticks(since, since + 7 * 86400)
    assert week[0][1] == "03-01 06:00" and week[-1][1] == "03-08 06:00"
    chart = line_chart({"used": [[since, 1.0], [since + 60, 2.0]]}, since, since + 3600)
    assert chart["xticks"] == time_ticks(since, since + 3600)
    assert chart["xticks"][-1][1] == "07:00"


def test_a_tenant_that_goes_idle_gets_one_zero_sample(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    queue = FairQueue(redis_client)
    queue.sync_config(load_config_dir(write_config(tmp_path / "config")), {"gpu": 8})
    history = FairnessHistory(redis_client, queue, interval=60)
    ticket, uid = str(uuid.uuid4()), str(uuid.uuid4())
    now = time.time()
    queue.admit(PodRequest(ticket, "team-a", "team-a-dev", "p", "training", {"gpu": 1}), now)
    queue.confirm(ticket, uid, "team-a-dev", "p")
    assert history.sample(now)
    assert queue.release(ticket, uid, now + 60)
    for minute in (1, 2, 3):
        assert history.sample(now + 60 * minute)
    points = history.series(["team-a"], now - 1)["team-a"]
    assert points[0][1] == 1.0
    assert [p[1:] for p in points[1:]] == [[0.0, 0.0]]  # one sample of zeros, then none
    # one Jain sample per slot; with a single tenant it is n/a, so none is charted
    assert redis_client.xlen("fairgate:fh") == 4
    assert history.jain(now - 1) == []


def test_jain_is_charted_over_two_tenants_entitled_to_something(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    queue = FairQueue(redis_client)
    queue.sync_config(load_config_dir(write_config(tmp_path / "config")), {"gpu": 8})
    history = FairnessHistory(redis_client, queue, interval=60)
    now = time.time()
    for tenant in ("team-a", "team-b"):
        ticket, uid = str(uuid.uuid4()), str(uuid.uuid4())
        queue.admit(PodRequest(ticket, tenant, f"{tenant}-dev", "p", "training",
                               {"gpu": 1}), now)
        queue.confirm(ticket, uid, f"{tenant}-dev", "p")
    assert history.sample(now)
    assert [index for _, index in history.jain(now - 1)] == [1.0]


def test_one_scale_holds_every_tenants_used_and_entitlement() -> None:
    """A tenant using 1 of 8 GPUs is drawn at an eighth of the height of one using 8, not
    as a full-height spike of its own scale."""
    samples = {"big": [[0.0, 8.0, 6.0], [60.0, 7.0, 6.0]],
               "small": [[0.0, 1.0, 1.0], [60.0, 1.0, 2.5]]}
    top = shared_top(samples)
    assert top == 10.0 and shared_top({}) == 1.0
    small = line_chart({"used": [[0.0, 1.0]]}, 0.0, 60.0, top)
    big = line_chart({"used": [[0.0, 8.0]]}, 0.0, 60.0, top)
    assert small["ticks"] == big["ticks"] and small["ticks"][-1][1] == "10"
    base, height = small["ticks"][0][0], small["ticks"][0][0] - small["ticks"][-1][0]
    small_y, big_y = (int(c["lines"]["used"].split(",")[1]) for c in (small, big))
    assert base - small_y == round(height / 10)
    assert base - big_y == round(height * 8 / 10)
    assert line_chart({"used": [[0.0, 1.0]]}, 0.0, 60.0)["top"] == 1.0  # its own scale

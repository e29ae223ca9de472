"""List and watch raw JSON objects through the official client: the loop every cache of
cluster objects runs in its own thread.

Contract:
- :func:`list_all` reads every page of a list (500 objects a page) and returns the items
  and the list's resourceVersion.
- :func:`watch` lists, hands the items to ``on_list``, then streams the changes from that
  version to ``on_event(type, object)`` (``ADDED``, ``MODIFIED``, ``DELETED``; bookmarks
  only move the version on), until ``stop`` is set. An expired version (410 Gone) lists
  again at once; any other failure lists again after the next :class:`Backoff` delay (the
  delays restart after each good list). With ``absent_ok``, a 404 on the list (the
  API group is not served, e.g. ``resource.k8s.io`` before Kubernetes 1.34) is an empty
  list, tried again after ``backoff.maximum``.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("fairgate.watch")

WATCH_SECONDS = 240
"""Server-side timeout of one watch request; the stream resumes from its last version."""
NOT_FOUND = 404
GONE = 410
_iter_lines: Callable[[Any], Iterator[str]] = iter_resp_lines

Lister = Callable[..., Any]
OnList = Callable[[list[Any]], None]
OnEvent = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: ``attempts`` tries, delays up to ``maximum``."""

    initial: float = 0.05
    factor: float = 2.0
    maximum: float = 2.0
    attempts: int = 6

    def delays(self) -> Iterator[float]:
        """The sleeps between consecutive attempts (``attempts - 1`` of them)."""
        delay = self.initial
        for _ in range(self.attempts - 1):
            yield random.uniform(0, delay)
            delay = min(delay * self.factor, self.maximum)


def list_all(lister: Lister, **kwargs: Any) -> tuple[list[Any], str]:
    """Every object ``lister`` returns (all pages), and the list's resourceVersion."""
    items: list[Any] = []
    token: str | None = None
    while True:
        response = lister(limit=500, _continue=token, _preload_content=False, **kwargs)
        body = json.loads(response.data)
        items.extend(body.get("items") or [])
        meta = body.get("metadata") or {}
        token = meta.get("continue") or None
        if token is None:
            return items, str(meta.get("resourceVersion", ""))


def watch(lister: Lister, on_list: OnList, on_event: OnEvent, stop: threading.Event,
          backoff: Backoff, *, absent_ok: bool = False, **kwargs: Any) -> None:
    """List and watch until ``stop`` is set (see the module doc); never raises."""
    delays: Iterator[float] = iter(())
    while not stop.is_set():
        try:
            items, rv = list_all(lister, **kwargs)
            on_list(items)
            delays = backoff.delays()
            while not stop.is_set():
                for event in _stream(lister, rv, stop, **kwargs):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                    if event.get("type") != "BOOKMARK":
                        on_event(str(event.get("type")), obj)
        except ApiException as error:
            if error.status == NOT_FOUND and absent_ok:
                on_list([])
                stop.wait(backoff.maximum)
            elif error.status != GONE:
                log.warning("watch failed (HTTP %s %s); relisting", error.status, error.reason)
                stop.wait(next(delays, backoff.maximum))
        except Exception as error:  # a watch thread must survive anything
            log.warning("watch failed (%s); relisting", error)
            stop.wait(next(delays, backoff.maximum))


def _stream(lister: Lister, rv: str, stop: threading.Event,
            **kwargs: Any) -> Iterator[dict[str, Any]]:
    response = lister(
        watch=True, resource_version=rv, allow_watch_bookmarks=True,
        timeout_seconds=WATCH_SECONDS, _preload_content=False,
        _request_timeout=(10, WATCH_SECONDS + 30), **kwargs,
    )
    try:
        for line in _iter_lines(response):
            if stop.is_set():
                return
            if line:
                yield json.loads(line)
    finally:
        response.close()
        response.release_conn()

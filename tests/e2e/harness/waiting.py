"""Polling helpers for e2e tests: the cluster converges asynchronously."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Call `probe` until it returns something other than None/False; return that value.

    Raises AssertionError naming `what` and the last value seen after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what} (last value: {last!r})"
            )
        time.sleep(interval)

"""Weighted fair entitlements by water-filling (DESIGN.md invariant 3).

Contract:
- :func:`water_fill` divides ``capacity`` among tenants in proportion to their weights,
  except that no tenant gets more than its cap (what it asks for, or what its quota
  lets it use); what a capped tenant leaves is shared again among the others, by
  weight, until nobody is capped or nothing is left. The result sums to
  ``min(capacity, sum of caps)`` (up to float rounding).
- Entitlements are for reporting and checking fairness (metrics, ``status``,
  ``simulate``, the property tests): floats are fine here; quota arithmetic stays in
  integer slices elsewhere.
- :func:`jain_index` is Jain's fairness index of the given values: 1.0 when all are
  equal, 1/n when one value takes everything; 1.0 for no values or all zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def water_fill(
    capacity: float, weights: Mapping[str, float], caps: Mapping[str, float | None]
) -> dict[str, float]:
    """Each tenant's entitlement out of ``capacity``.

    ``weights``: tenant -> weight (> 0); ``caps``: tenant -> the most it can use
    (``None`` or missing: no limit). Raises ValueError for a weight <= 0 or a negative
    capacity or cap.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    for tenant, weight in weights.items():
        if weight <= 0:
            raise ValueError(f"weight of {tenant} must be > 0, got {weight}")
        cap = caps.get(tenant)
        if cap is not None and cap < 0:
            raise ValueError(f"cap of {tenant} must be >= 0, got {cap}")
    share = {tenant: 0.0 for tenant in weights}
    open_ = set(weights)
    left = float(capacity)
    while open_ and left > 1e-12:
        level = left / sum(weights[t] for t in open_)
        capped = {
            t for t in open_
            if (cap := caps.get(t)) is not None and cap - share[t] <= weights[t] * level
        }
        if not capped:
            for t in open_:
                share[t] += weights[t] * level
            break
        for t in capped:
            cap = caps[t]
            assert cap is not None
            left -= cap - share[t]
            share[t] = float(cap)
        open_ -= capped
    return share


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2)."""
    xs = list(values)
    squares = sum(x * x for x in xs)
    if not xs or squares == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * squares)

"""`fairgate simulate` with pricing: GPU hours, cost and the price of preemption, on the
example where inference bursts preempt borrowed training (real queue, real Redis)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fairshare.sim.simulate import run_simulation
from fairshare.sim.trace import load_trace
from tenants.models import GpuEquivalents

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "preemption-cost.yaml"


@pytest.mark.slow
def test_borrowing_gains_more_gpu_hours_than_preemption_throws_away(redis_url: str) -> None:
    trace = load_trace(EXAMPLE)
    assert trace.pricing is not None and trace.pricing.price(None) == 2.5
    borrowing = run_simulation(trace, redis_url)
    research = borrowing.tenants["research"]
    assert research.cost == pytest.approx(research.gpu_hours * 2.5)
    assert borrowing.preemptions > 0
    assert 0 < borrowing.preempted_gpu_hours < research.gpu_hours
    data = borrowing.to_json()
    assert data["preemption"]["pods"] == borrowing.preemptions
    assert data["tenants"]["research"]["cost"] == round(research.cost, 2)

    quota = trace.tenants["research"].model_copy(update={"borrow_limit": GpuEquivalents()})
    nominal_only = run_simulation(
        trace.model_copy(update={"tenants": {**trace.tenants, "research": quota}}), redis_url)
    assert nominal_only.preemptions == 0 and nominal_only.preempted_gpu_hours == 0
    # research alone on its 4 GPUs for the 4 h horizon runs at most 16 GPU-hours
    assert nominal_only.tenants["research"].gpu_hours <= 4 * 4
    gained = research.gpu_hours - nominal_only.tenants["research"].gpu_hours
    assert gained > 5 * borrowing.preempted_gpu_hours
    # serving's inference is untouched by research's borrowing
    assert borrowing.tenants["serving"].gpu_hours == pytest.approx(
        nominal_only.tenants["serving"].gpu_hours)

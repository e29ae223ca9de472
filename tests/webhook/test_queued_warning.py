"""The webhook's queued warning is one true sentence within the API server's
120-character advice: it says only what the queue said, and a long one is cut between
words, never inside one."""

from __future__ import annotations

from admission.plan import PodPlan
from admission.reviews import MAX_WARNING_CHARS, clean_warning, one_line
from fairshare.queue.calls import explain
from fairshare.queue.model import Admission
from tenants.models import Principals, Tenant
from webhook.service import _queued_warning

REASONS = [["gang", "team-a-research/ddp7", "3", "4"], ["never"], ["quota", "7"],
           ["borrow", "14"], ["capacity", "gpu", "4"], ["held", "gpu", "2", "4"],
           ["guard", "gpu", "team-b"], ["ahead", "12"], ["inference"], ["priority"],
           ["rebuild"], ["turn"], ["release"]]


def _plan(tenant: str) -> PodPlan:
    owner = Tenant(name=tenant, weight=1.0, ceiling_slices=70, admins=Principals(),
                   classes=("training",), node_pool=None, nominal={"gpu": 4},
                   borrow_slices=14, reserve_slices=7, default_class="training")
    return PodPlan(tenant=owner, pod_class="training", class_reason="", demand={"gpu": 1},
                   demand_slices=7, ticket="t", reused_ticket=False, group=None)


def test_every_queued_warning_is_one_sentence_cut_between_words() -> None:
    for tenant in ("team-a", "t" * 63):
        plan = _plan(tenant)
        for reason in REASONS:
            for position in (None, 1, 2, 3, 11, 123):
                waiting_for = explain(reason, tenant, "training")
                admission = Admission("queued", "borrowed", position, 200, 0, 28, waiting_for)
                text = _queued_warning(plan, admission)
                sent = clean_warning(text)
                assert len(sent) <= MAX_WARNING_CHARS
                assert sent.startswith("Queued as borrowed")
                body = sent.removesuffix("...").removesuffix(".")
                assert body.count(".") <= waiting_for.count(".")  # one sentence
                if sent == text:
                    assert sent.endswith(".")
                else:  # cut: only whole words of the sentence are kept
                    kept = sent.removesuffix("...")
                    assert text.startswith(kept)
                    assert text[len(kept)] in " ,;:", (kept, text)
                # it claims no free quota beside a wait (the old warning said "4.00 of
                # 4.00 GPU-eq free; waiting for ...")
                assert "free" not in sent


def test_the_reasons_of_a_gang_that_fits_read_as_a_wait_not_a_refusal() -> None:
    text = _queued_warning(_plan("team-a"), Admission(
        "queued", "borrowed", 1, 1, 0, 28, explain(["release"], "team-a", "training")))
    assert text == ("Queued as borrowed, 1st of 1 training pods of team-a, waiting for the "
                    "dispatcher to release it: it fits now.")
    assert len(text) <= MAX_WARNING_CHARS


def test_one_line_cuts_between_words() -> None:
    assert one_line("alpha beta gamma", 14) == "alpha beta..."
    assert one_line("alpha, beta gamma", 12) == "alpha..."
    assert one_line("x" * 20, 10) == "xxxxxxx..."
    assert one_line("short", 10) == "short"

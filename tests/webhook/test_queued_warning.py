"""The webhook's queued warning is one true sentence within the API server's
120-character advice: it says only what the queue said, and a long one is cut between
words, never inside one."""

from __future__ import annotations

from dataclasses import replace

from admission.plan import PodGroup, PodPlan
from admission.reviews import MAX_WARNING_CHARS, clean_warning, one_line
from fairshare.queue.calls import explain
from fairshare.queue.model import UNKNOWN_GANG_SIZE, Admission
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


def _member(tenant: str, source: str, size: int | None, name: str = "ddp7") -> PodPlan:
    return replace(_plan(tenant), group=PodGroup(name, size, source))


def _gang_admission(created: int, size: int, source: str, awaiting: str = "",
                    band: str = "training") -> Admission:
    reason = ("gang", "team-a-research/job.trainer.1a2b3c4d5e", str(created), str(size), source,
              awaiting)
    return Admission("queued", band, None, 7, 0, 28,  # type: ignore[arg-type]
                     explain(list(reason), "team-a", "training"), reason=reason)


def _one_sentence_that_fits(text: str) -> None:
    assert len(text) <= MAX_WARNING_CHARS, (len(text), text)
    assert clean_warning(text) == text  # never cut by the response builder
    # one sentence: its only full stop is the last (a long name is shortened with "...")
    assert text.endswith(".") and ". " not in text.replace("...", "") and \
        not text.endswith("...."), text
    assert "free" not in text


LONG = "n" * 63  # the longest Kubernetes name a gang's object can have


def test_a_gang_members_warning_names_its_gang_and_what_it_waits_for() -> None:
    plan = _member("team-a", "Indexed Job trainer", 4)
    assert _queued_warning(plan, _gang_admission(3, 4, "Indexed Job trainer")) == (
        "Queued as training, waiting for the 4th pod of gang of Indexed Job trainer (3 of 4 "
        "pods created).")
    assert _queued_warning(plan, _gang_admission(1, 4, "Indexed Job trainer")) == (
        "Queued as training, waiting for 3 more pods of gang of Indexed Job trainer (1 of 4 "
        "pods created).")
    # fairgate's own label: the source the webhook gives the queue is the group's name
    own = _member("team-a", "", 2)
    assert _queued_warning(own, _gang_admission(1, 2, "pod group ddp7")) == (
        "Queued as training, waiting for the 2nd pod of gang of pod group ddp7 (1 of 2 pods "
        "created).")


def test_every_gang_warning_is_one_whole_sentence_within_the_advice() -> None:
    sources = ["Indexed Job trainer", f"Indexed Job {LONG}", f"JobSet {LONG}",
               f"LeaderWorkerSet {LONG} group 12345", f"Kueue pod group {LONG}",
               f"PodGroup {LONG}", "pod group " + LONG, ""]
    for tenant in ("team-a", "t" * 63):
        for source in sources:
            for band in ("training", "borrowed"):
                for created, size in ((1, 2), (3, 4), (1, 10_000), (9_999, 10_000)):
                    text = _queued_warning(_member(tenant, source, size),
                                           _gang_admission(created, size, source, band=band))
                    _one_sentence_that_fits(text)
                    assert f"of {size} pods created" in text
                    assert "gang of " in text or source == ""


def test_an_unknown_size_gang_warning_says_it_waits_for_the_size() -> None:
    plan = _member("team-a", "JobSet trainer", None)
    text = _queued_warning(plan, _gang_admission(
        2, UNKNOWN_GANG_SIZE, "JobSet trainer", "JobSet trainer is seen"))
    assert text == ("Queued as training, waiting for the size of gang of JobSet trainer (2 pods "
                    "created; known once JobSet trainer is seen).")
    for source, awaiting in ((f"JobSet {LONG}", f"JobSet {LONG} is seen"),
                             (f"PodGroup {LONG}", f"PodGroup {LONG} (scheduling.k8s.io) exists"),
                             (f"Indexed Job {LONG}", f"Job {LONG} is seen")):
        for created in (1, 2, 9_999):
            text = _queued_warning(_member("t" * 63, source, None), _gang_admission(
                created, UNKNOWN_GANG_SIZE, source, awaiting, band="borrowed"))
            _one_sentence_that_fits(text)
            assert text.startswith("Queued as borrowed, waiting for the size of gang of ")
            assert "pod created" in text or "pods created" in text


def test_a_never_fits_warning_is_one_whole_sentence_also_for_a_gang() -> None:
    """What never fits is refused at CREATE; a quota lowered while the pod is admitted can
    still leave the queue saying so, and the warning then says it in one sentence."""
    for plan in (_plan("team-a"), _plan("t" * 63), _member("t" * 63, f"JobSet {LONG}", 4)):
        for position in (None, 1, 123):
            admission = Admission("queued", "borrowed", position, 200, 0, 28,
                                  explain(["never"], "team-a", "training"), reason=("never",))
            text = _queued_warning(plan, admission)
            _one_sentence_that_fits(text)
            assert "never fits" in text and "waiting for the 2nd" not in text


def test_a_complete_gangs_warning_names_it_when_that_fits() -> None:
    admission = Admission("queued", "borrowed", 1, 3, 0, 28,
                          explain(["quota", "28"], "team-a", "training"), reason=("quota", "28"))
    assert _queued_warning(_member("team-a", "Indexed Job trainer", 4), admission) == (
        "Queued as borrowed with its gang of Indexed Job trainer (4 pods), waiting for 4.00 "
        "GPU-eq of tenant quota.")  # its place in the queue would not fit too
    _one_sentence_that_fits(_queued_warning(_member("t" * 63, f"JobSet {LONG}", 4), admission))

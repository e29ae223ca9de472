"""Config sources: hot reload from a local directory, and per-object last-good bookkeeping."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tenants.source import (
    ConfigAssembler,
    ConfigEdit,
    ConfigNotReadyError,
    LocalDirSource,
    start_local_source,
)

PLATFORM = """\
platformAdmins: {groups: [platform-team]}
tenants:
  team-a: {weight: 2, ceiling: {gpuEquivalents: 24}, admins: {users: [alice]}}
  team-b: {weight: 1, ceiling: {gpuEquivalents: 8}}
"""
NAMESPACES = "team-a-dev: {fairgate.io/tenant: team-a}\n"


def _failures(obj: str) -> float:
    value = REGISTRY.get_sample_value("fairgate_config_reload_failures_total",
                                      {"configmap": obj})
    return value or 0.0


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "quota-team-a.yaml").write_text("nominal: {gpu: 8}\n")
    (tmp_path / "namespaces.yaml").write_text(NAMESPACES)
    return tmp_path


@pytest.fixture
def polled(config_dir: Path) -> Iterator[LocalDirSource]:
    with LocalDirSource(config_dir, poll_interval=0.02) as source:
        assert isinstance(source, LocalDirSource)
        yield source


def _nominal(source: LocalDirSource, tenant: str = "team-a") -> dict[str, int]:
    found = source.config.tenant(tenant)
    assert found is not None
    return dict(found.nominal)


def test_first_load_makes_it_ready(polled: LocalDirSource) -> None:
    assert polled.ready and polled.last_error == {}
    assert polled.config.tenant_of_namespace("team-a-dev") == "team-a"
    assert _nominal(polled) == {"gpu": 8}


def test_valid_edit_takes_effect_without_restart(polled: LocalDirSource, config_dir: Path) -> None:
    before = polled.generation
    (config_dir / "quota-team-a.yaml").write_text("nominal: {gpu: 12, mig-1g.5gb: 7}\n")
    assert _wait_for(lambda: _nominal(polled) == {"gpu": 12, "mig-1g.5gb": 7})
    assert polled.generation > before
    extra = "b-prod: {fairgate.io/tenant: team-b}\n"
    (config_dir / "namespaces.yaml").write_text(NAMESPACES + extra)
    assert _wait_for(lambda: polled.config.tenant_of_namespace("b-prod") == "team-b")


def test_broken_edit_keeps_old_config_and_is_reported(
    polled: LocalDirSource, config_dir: Path,
) -> None:
    path = config_dir / "quota-team-a.yaml"
    failures = _failures(str(path))
    path.write_text("nominal: {gpu: 8\nborrowLimit: {}\n")
    assert _wait_for(lambda: str(path) in polled.last_error)
    assert "YAML syntax error" in polled.last_error[str(path)]
    assert "line 2" in polled.last_error[str(path)]
    assert _failures(str(path)) == failures + 1
    assert _nominal(polled) == {"gpu": 8}
    path.write_text("nominal: {gpu: 99}\n")  # above the ceiling: still refused
    assert _wait_for(lambda: "exceeds the ceiling" in polled.last_error.get(str(path), ""))
    assert _nominal(polled) == {"gpu": 8}
    path.write_text("nominal: {gpu: 3}\n")
    assert _wait_for(lambda: _nominal(polled) == {"gpu": 3})
    assert polled.last_error == {}


def test_explicit_reload_reports_success(config_dir: Path) -> None:
    source = LocalDirSource(config_dir)
    source.start()
    (config_dir / "platform.yaml").write_text(PLATFORM + "surprise: 1\n")
    assert source.reload() is False
    assert "surprise: unknown key" in source.last_error[str(config_dir / "platform.yaml")]
    assert source.config.tenant("team-a") is not None
    (config_dir / "platform.yaml").write_text(PLATFORM.replace("weight: 2", "weight: 5"))
    assert source.reload() is True
    team_a = source.config.tenant("team-a")
    assert team_a is not None and team_a.weight == 5


def test_unreadable_file_is_reported_not_fatal(polled: LocalDirSource, config_dir: Path) -> None:
    path = config_dir / "quota-team-a.yaml"
    path.write_bytes(b"nominal: {gpu: \xff}\n")
    assert _wait_for(lambda: "not UTF-8" in polled.last_error.get(str(path), ""))
    assert _nominal(polled) == {"gpu": 8}
    path.write_text("nominal: {gpu: 5}\n")
    assert _wait_for(lambda: _nominal(polled) == {"gpu": 5}), "the poller survived"


def test_start_local_source_names_the_problem_or_returns_a_loaded_source(
    tmp_path: Path,
) -> None:
    (tmp_path / "platform.yaml").write_text("tenants: {team-a: {weight: 0}}\n")
    with pytest.raises(ConfigNotReadyError, match=r"cannot load the config in .*weight"):
        start_local_source(tmp_path, poll_interval=60)
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    source = start_local_source(tmp_path, poll_interval=60)
    try:
        assert source.ready and "team-a" in source.config.platform.tenants
    finally:
        source.close()


def test_a_failed_load_speaks_of_a_last_good_version_only_when_there_is_one(
        config_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    platform = config_dir / "platform.yaml"
    good = platform.read_text()
    platform.write_text("tenants: [oops\n")
    with caplog.at_level("WARNING", logger="tenants.source"):
        source = LocalDirSource(config_dir)
        source.start()
        assert not source.ready
        platform.write_text(good)
        assert source.reload()
        platform.write_text("tenants: [still oops\n")
        assert not source.reload()
    first, later = caplog.messages
    assert first.startswith(f"config {platform} cannot be used, and no earlier version of it "
                            "was: ")
    assert later.startswith(f"config {platform} not reloaded, keeping the last good version: ")


def test_in_use_says_whether_a_good_version_of_an_object_is_used() -> None:
    state = ConfigAssembler()
    assert not state.in_use("fairgate-system/fairgate-platform")
    assert state.set_platform({"platform.yaml": "tenants: [oops"}) != {}
    assert not state.in_use("fairgate-system/fairgate-platform")
    assert state.set_platform({"platform.yaml": PLATFORM}) == {}
    assert state.in_use("fairgate-system/fairgate-platform")
    assert state.set_quota("quota-team-a", {"quota.yaml": "nominal: {gpu: x}"},
                           QUOTA_LABELS) != {}
    assert not state.in_use("fairgate-system/quota-team-a")
    assert state.set_quota("quota-team-a", {"quota.yaml": "nominal: {gpu: 1}"},
                           QUOTA_LABELS) == {}
    assert state.set_quota("quota-team-a", {"quota.yaml": "nominal: {gpu: x}"},
                           QUOTA_LABELS) != {}
    assert state.in_use("fairgate-system/quota-team-a")
    state.set_platform(None)
    assert not state.in_use("fairgate-system/fairgate-platform")


def test_not_ready_until_the_first_good_load(tmp_path: Path) -> None:
    source = LocalDirSource(tmp_path)
    source.start()
    assert not source.ready
    with pytest.raises(ConfigNotReadyError, match=r"platform\.yaml: file not found"):
        _ = source.config
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    assert source.reload() and source.ready


# -- ConfigAssembler: what the cluster source does per ConfigMap -------------------------

QUOTA_LABELS = {"fairgate.io/quota": "team-a"}


@pytest.fixture
def state() -> ConfigAssembler:
    assembler = ConfigAssembler()
    assert assembler.set_platform({"platform.yaml": PLATFORM}) == {}
    assert assembler.set_quota("quota-team-a", {"quota.yaml": "nominal: {gpu: 8}"},
                               QUOTA_LABELS) == {}
    assert assembler.set_quota("quota-team-b", {"quota.yaml": "nominal: {gpu: 2}"},
                               {"fairgate.io/quota": "team-b"}) == {}
    return assembler


def _quota(state: ConfigAssembler, tenant: str) -> dict[str, int]:
    found = state.snapshot().tenant(tenant)
    assert found is not None
    return dict(found.nominal)


def test_broken_quota_keeps_that_tenants_last_good(state: ConfigAssembler) -> None:
    failed = state.set_quota("quota-team-a", {"quota.yaml": "nominal: {gpu: x}"}, QUOTA_LABELS)
    assert list(failed) == ["fairgate-system/quota-team-a"]
    assert "nominal.gpu" in failed["fairgate-system/quota-team-a"]
    assert _quota(state, "team-a") == {"gpu": 8}
    assert _quota(state, "team-b") == {"gpu": 2}
    assert state.set_quota("quota-team-a", {"quota.yaml": "nominal: {gpu: x}"},
                           QUOTA_LABELS) == {}, "the same broken version is not reported twice"
    assert state.set_quota("quota-team-a", {"quota.yaml": "nominal: {gpu: 4}"},
                           QUOTA_LABELS) == {}
    assert _quota(state, "team-a") == {"gpu": 4} and state.errors == {}


def test_quota_with_wrong_label_or_key_is_not_used(state: ConfigAssembler) -> None:
    failed = state.set_quota("quota-team-a", {"quota.yaml": "nominal: {gpu: 1}"}, {})
    assert "set label 'fairgate.io/quota: team-a'" in failed["fairgate-system/quota-team-a"]
    failed = state.set_quota("quota-team-a", {"quota.yml": "nominal: {gpu: 1}"}, QUOTA_LABELS)
    assert "missing key 'quota.yaml'" in failed["fairgate-system/quota-team-a"]
    assert _quota(state, "team-a") == {"gpu": 8}


def test_stored_quota_borrowing_above_the_ceiling_is_not_used(
    state: ConfigAssembler, tmp_path: Path,
) -> None:
    """A quota stored without the webhook (or before this rule) never grants more than
    the ceiling: it is refused like any broken quota; the tenant keeps its last good one."""
    greedy = {"quota.yaml": "nominal: {gpu: 8}\nborrowLimit: {gpuEquivalents: 1000}"}
    failed = state.set_quota("quota-team-a", greedy, QUOTA_LABELS)
    assert ("nominal 8.00 + borrowLimit 1000.00 GPU-eq = 1008.00 exceeds team-a's ceiling "
            "24.00: lower borrowLimit to at most 16.00") in failed["fairgate-system/quota-team-a"]
    team_a = state.snapshot().tenant("team-a")
    assert team_a is not None and team_a.borrow_slices == 0 and dict(team_a.nominal) == {"gpu": 8}
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "quota-team-a.yaml").write_text(greedy["quota.yaml"])
    with pytest.raises(ConfigNotReadyError, match=r"exceeds team-a's ceiling 24\.00"):
        start_local_source(tmp_path)


def test_broken_platform_keeps_the_last_good(state: ConfigAssembler) -> None:
    failed = state.set_platform({"platform.yaml": "tenants: [oops"})
    assert "YAML syntax error" in failed["fairgate-system/fairgate-platform"]
    assert sorted(t.name for t in state.snapshot().tenants()) == ["team-a", "team-b"]


def test_lowered_ceiling_keeps_the_last_good_quota_and_reports_it(state: ConfigAssembler) -> None:
    failed = state.set_platform({"platform.yaml": PLATFORM.replace("24", "4")})
    assert "exceeds the ceiling" in failed["fairgate-system/quota-team-a"]
    snapshot = state.snapshot()
    assert snapshot.platform.tenants["team-a"].ceiling.gpu_equivalents == 4
    assert _quota(state, "team-a") == {"gpu": 8}
    assert state.set_platform({"platform.yaml": PLATFORM}) == {}
    assert state.errors == {}


def test_deleted_objects(state: ConfigAssembler) -> None:
    assert state.set_quota("quota-team-b", None, None) == {}
    assert _quota(state, "team-b") == {}
    state.set_platform(None)
    assert state.snapshot().tenants() == []
    assert "not found" in state.errors["fairgate-system/fairgate-platform"]


def test_namespace_labels(state: ConfigAssembler) -> None:
    state.set_namespace("a-dev", {"fairgate.io/tenant": "team-a", "other": "x"})
    assert state.snapshot().namespaces == {"a-dev": {"fairgate.io/tenant": "team-a"}}
    state.set_namespace("a-dev", {"other": "x"})
    assert state.snapshot().tenant_of_namespace("a-dev") is None


# -- LocalDirSource, file by file ---------------------------------------------------------


@pytest.fixture
def two_tenants(config_dir: Path) -> Path:
    (config_dir / "quota-team-b.yaml").write_text("nominal: {gpu: 2}\n")
    return config_dir


def test_a_broken_file_does_not_hold_back_another_tenants_edit(two_tenants: Path) -> None:
    source = LocalDirSource(two_tenants)
    source.start()
    broken = two_tenants / "quota-team-b.yaml"
    broken.write_text("nominal: {gpu: 2\n")  # team-b's admin breaks its file
    (two_tenants / "quota-team-a.yaml").write_text("nominal: {gpu: 5}\n")
    assert source.reload() is False
    assert _nominal(source) == {"gpu": 5}, "team-a's valid edit is in use"
    assert _nominal(source, "team-b") == {"gpu": 2}, "team-b keeps its last good quota"
    assert list(source.last_error) == [str(broken)]
    assert "YAML syntax error" in source.last_error[str(broken)]
    (two_tenants / "quota-team-a.yaml").write_text("nominal: {gpu: 6}\n")
    assert source.reload() is False
    assert _nominal(source) == {"gpu": 6}, "and the next one too"
    broken.write_text("nominal: {gpu: 1}\n")
    assert source.reload() is True
    assert _nominal(source, "team-b") == {"gpu": 1} and source.last_error == {}


def test_a_broken_platform_keeps_its_last_good_and_quotas_are_checked_against_it(
    two_tenants: Path,
) -> None:
    source = LocalDirSource(two_tenants)
    source.start()
    platform = two_tenants / "platform.yaml"
    platform.write_text(PLATFORM + "surprise: 1\n")
    (two_tenants / "quota-team-b.yaml").write_text("nominal: {gpu: 9}\n")  # ceiling 8
    (two_tenants / "quota-team-a.yaml").write_text("nominal: {gpu: 7}\n")
    assert source.reload() is False
    assert set(source.last_error) == {str(platform), str(two_tenants / "quota-team-b.yaml")}
    assert "exceeds the ceiling" in source.last_error[str(two_tenants / "quota-team-b.yaml")]
    assert "surprise" not in source.config.platform.model_dump()
    assert _nominal(source) == {"gpu": 7} and _nominal(source, "team-b") == {"gpu": 2}
    # a lowered ceiling is taken; the quota above it keeps its last good version
    platform.write_text(PLATFORM.replace("gpuEquivalents: 24", "gpuEquivalents: 6"))
    (two_tenants / "quota-team-b.yaml").write_text("nominal: {gpu: 2}\n")
    assert source.reload() is False
    team_a = source.config.platform.tenants["team-a"]
    assert team_a.ceiling.gpu_equivalents == 6
    assert list(source.last_error) == [str(two_tenants / "quota-team-a.yaml")]
    assert _nominal(source) == {"gpu": 7}


def test_files_added_broken_or_deleted_after_the_first_load(two_tenants: Path) -> None:
    source = LocalDirSource(two_tenants)
    source.start()
    (two_tenants / "quota_team-c.yaml").write_text("nominal: {gpu: 1}\n")  # misnamed
    (two_tenants / "quota-team-b.yaml").unlink()
    (two_tenants / "namespaces.yaml").write_text(NAMESPACES + "x: {fairgate.io/tenant: nope}\n")
    assert source.reload() is False
    assert source.config.quotas.keys() == {"team-a"}, "a deleted quota file is a valid edit"
    assert source.config.tenant_of_namespace("team-a-dev") == "team-a"
    assert source.config.tenant_of_namespace("x") is None, "namespaces keep their last good"
    assert "rename it to quota-team-c.yaml" in source.last_error[
        str(two_tenants / "quota_team-c.yaml")]
    assert "'nope' is not defined" in source.last_error[str(two_tenants / "namespaces.yaml")]
    (two_tenants / "quota-team-b.yaml").write_text("nominal: {gpu: x}\n")  # never good
    assert source.reload() is False
    assert source.config.quotas.keys() == {"team-a"}


def test_an_accepted_reload_is_logged_and_each_edit_handed_on(
    two_tenants: Path, caplog: pytest.LogCaptureFixture
) -> None:
    edits: list[ConfigEdit] = []
    source = LocalDirSource(two_tenants, on_edit=edits.append)
    source.start()
    assert edits == [], "the first load is no edit"
    (two_tenants / "quota-team-a.yaml").write_text(
        "nominal: {gpu: 4}\nborrowLimit: {gpuEquivalents: 2}\n")
    (two_tenants / "quota-team-b.yaml").write_text("nominal: [\n")
    (two_tenants / "platform.yaml").write_text(PLATFORM.replace("weight: 1", "weight: 3"))
    (two_tenants / "namespaces.yaml").write_text(NAMESPACES + "b: {fairgate.io/tenant: team-b}\n")
    with caplog.at_level("INFO", logger="tenants.source"):
        assert source.reload() is False
    (line,) = [r for r in caplog.records if r.getMessage().startswith("config reloaded")]
    fields = getattr(line, "fields")  # noqa: B009 - set through extra=
    assert fields["event"] == "config-reload"
    assert fields["changed"] == ["namespaces.yaml", "platform.yaml", "quota-team-a.yaml"]
    assert fields["kept"] == ["quota-team-b.yaml"]
    assert "quota-team-b.yaml" in line.getMessage()
    assert edits == [
        ConfigEdit(file="platform.yaml", obj="fairgate-platform", tenant="", operation="UPDATE",
                   diff={"tenants.team-b.weight": {"before": 1, "after": 3}}),
        ConfigEdit(file="quota-team-a.yaml", obj="quota-team-a", tenant="team-a",
                   operation="UPDATE",
                   diff={"borrowLimit.gpuEquivalents": {"before": None, "after": 2},
                         "nominal.gpu": {"before": 8, "after": 4}}),
    ]
    edits.clear()
    (two_tenants / "quota-team-b.yaml").unlink()
    (two_tenants / "quota-team-c.yaml").write_text("nominal: {}\n")  # not in the platform
    (two_tenants / "quota-team-a.yaml").unlink()
    assert source.reload() is False
    assert [(e.file, e.operation) for e in edits] == [("quota-team-a.yaml", "DELETE"),
                                                      ("quota-team-b.yaml", "DELETE")]
    assert source.reload() is False and len(edits) == 2, "a re-read changes nothing"

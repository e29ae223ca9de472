"""platform.yaml / quota.yaml parsing: errors name the file, field and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenants.localdir import load_config_dir, write_config_dir
from tenants.schema import ConfigError, parse_platform, parse_quota

PLATFORM = """
platformAdmins: {groups: [platform-team], users: []}
tenants:
  team-a:
    weight: 2
    ceiling: {gpuEquivalents: 24}
    admins: {groups: [team-a-admins], users: [alice@example.com]}
  team-b:
    weight: 1.5
    ceiling: {gpuEquivalents: 4}
    classes: [training]
onRedisUnavailable: deny
"""

QUOTA = """
nominal: {gpu: 8, mig-1g.5gb: 14}
borrowLimit: {gpuEquivalents: 4}
inferenceReserve: {gpuEquivalents: 2}
defaultClass: training
"""


def test_design_examples_parse() -> None:
    platform = parse_platform(PLATFORM)
    quota = parse_quota(QUOTA, "team-a", platform)
    assert platform.tenants["team-a"].ceiling.slices == 168
    assert platform.tenants["team-b"].classes == ("training",)
    assert quota.nominal_slices == 8 * 7 + 14
    assert quota.borrow_limit.slices == 28
    assert quota.inference_reserve.slices == 14


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nominal: {gpu: 8}\nborowLimit: {gpuEquivalents: 1}", "borowLimit: unknown key"),
        ("nominal: {gpu: -1}", "nominal.gpu: must be 0 or more"),
        ("nominal: {gpu: 1.5}", "nominal.gpu: must be a whole number"),
        ("nominal: {gpu: '2'}", "nominal.gpu: must be a whole number"),
        ("nominal: {mig-9g.9gb: 1}", "unknown GPU resource 'mig-9g.9gb'"),
        ("nominal: {gpu: 30}", "exceeds the ceiling of 24 GPU-eq"),
        ("nominal: {gpu: 8}\nborrowLimit: {gpuEquivalents: 20}",
         "borrowLimit.gpuEquivalents: nominal 8.00 + borrowLimit 20.00 GPU-eq = 28.00 exceeds "
         "team-a's ceiling 24.00: lower borrowLimit to at most 16.00"),
        ("nominal: {gpu: 8, mig-1g.5gb: 3}\nborrowLimit: {gpuEquivalents: 16}",
         "nominal 8.43 + borrowLimit 16.00 GPU-eq = 24.43 exceeds team-a's ceiling 24.00: "
         "lower borrowLimit to at most 15.00"),
        ("nominal: {gpu: 1}\ninferenceReserve: {gpuEquivalents: 2}",
         "inferenceReserve.gpuEquivalents: 2 is more than the nominal quota"),
        ("defaultClass: batch", "defaultClass: must be one of"),
        ("nominal: {gpu: 1\n  x: [", "line 2: YAML syntax error"),
        ("a: &x [1]\nb: *x", "aliases"),
        ("- 1\n- 2", "expected a mapping"),
    ],
)
def test_quota_errors_are_precise(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_quota(text, "team-a", parse_platform(PLATFORM))
    assert expected in str(info.value)
    assert str(info.value).startswith("quota-team-a.yaml: ")


def test_borrow_limit_up_to_the_ceiling_is_accepted() -> None:
    quota = parse_quota("nominal: {gpu: 8}\nborrowLimit: {gpuEquivalents: 16}", "team-a",
                        parse_platform(PLATFORM))
    assert quota.nominal_slices + quota.borrow_limit.slices == 24 * 7


def test_quota_for_unknown_tenant_is_refused() -> None:
    with pytest.raises(ConfigError, match="not defined in fairgate-platform"):
        parse_quota("nominal: {gpu: 1}", "team-z", parse_platform(PLATFORM))


def test_platform_weight_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"tenants.team-a.weight: must be greater than 0"):
        parse_platform("tenants: {team-a: {weight: 0, ceiling: {gpuEquivalents: 1}}}")


def test_config_dir_loads_all_files(tmp_path: Path) -> None:
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "quota-team-a.yaml").write_text(QUOTA)
    (tmp_path / "namespaces.yaml").write_text(
        "team-a-dev: {fairgate.io/tenant: team-a}\nscratch: {}\n"
    )
    config = load_config_dir(tmp_path)
    assert config.tenant_of_namespace("team-a-dev") == "team-a"
    assert config.tenant_of_namespace("scratch") is None
    tenant_a = config.tenant("team-a")
    assert tenant_a is not None and tenant_a.nominal == {"gpu": 8, "mig-1g.5gb": 14}
    tenant_b = config.tenant("team-b")
    assert tenant_b is not None and tenant_b.nominal == {} and tenant_b.weight == 1.5
    assert config.tenant("team-z") is None


def test_config_dir_error_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "quota-team-b.yaml").write_text("nominal: {gpu: 5}")
    with pytest.raises(ConfigError) as info:
        load_config_dir(tmp_path)
    assert info.value.source.endswith("quota-team-b.yaml")
    assert "ceiling of 4 GPU-eq" in str(info.value)


def test_missing_platform_file_says_what_to_create(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"platform\.yaml: file not found"):
        load_config_dir(tmp_path)


def test_missing_platform_file_names_the_files_and_no_missing_doc(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config_dir(tmp_path)
    assert "quota-<tenant>.yaml" in str(info.value) and "namespaces.yaml" in str(info.value)
    assert "docs/configuration.md" not in str(info.value)


def test_a_missing_config_directory_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config: directory not found: give --config-dir"):
        load_config_dir(tmp_path / "config")
    (tmp_path / "file").write_text(PLATFORM)
    with pytest.raises(ConfigError, match=r"file: not a directory"):
        load_config_dir(tmp_path / "file")


@pytest.mark.parametrize(("name", "meant"), [
    ("quota_team-a.yaml", "rename it to quota-team-a.yaml"),
    ("quota-team-a.yml", "rename it to quota-team-a.yaml"),
    ("Quota-team-a.yaml", "rename it to quota-team-a.yaml"),
    ("quotateam-a.yaml", "rename it to quota-team-a.yaml"),
    ("Platform.yaml", "rename it to platform.yaml"),
    ("namespaces.yml", "rename it to namespaces.yaml"),
    ("tenants.json", "rename or remove it"),
])
def test_a_misnamed_yaml_file_is_refused_with_the_name_it_needs(
        tmp_path: Path, name: str, meant: str) -> None:
    """A quota file fairgate does not read would leave its tenant without quota."""
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / name).write_text(QUOTA)
    with pytest.raises(ConfigError) as info:
        load_config_dir(tmp_path)
    assert info.value.source == str(tmp_path / name)
    assert meant in str(info.value) and "platform.yaml, quota-<tenant>.yaml" in str(info.value)


def test_other_files_are_warned_about_and_hidden_ones_skipped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "quota-team-a.yaml").write_text(QUOTA)
    (tmp_path / "README.md").write_text("our quotas\n")
    (tmp_path / ".quota-team-a.yaml.swp").write_text("x")
    (tmp_path / "..data").mkdir()  # a mounted ConfigMap's own directory
    with caplog.at_level("WARNING", logger="tenants.localdir"):
        config = load_config_dir(tmp_path)
    assert config.tenant("team-a") is not None
    (warning,) = caplog.messages
    assert warning.startswith(f"{tmp_path / 'README.md'}: not a config file, ignored")


def test_a_namespace_of_an_undefined_tenant_is_refused(tmp_path: Path) -> None:
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "namespaces.yaml").write_text(
        "team-a-dev: {fairgate.io/tenant: team-a}\nteam-c-dev: {fairgate.io/tenant: team-c}\n")
    with pytest.raises(ConfigError) as info:
        load_config_dir(tmp_path)
    assert info.value.source == str(tmp_path / "namespaces.yaml")
    assert str(info.value).endswith(
        "team-c-dev.fairgate.io/tenant: tenant 'team-c' is not defined in platform.yaml (its "
        "tenants: team-a, team-b): fix the name or add the tenant")


def test_unreadable_quota_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "platform.yaml").write_text(PLATFORM)
    (tmp_path / "quota-team-a.yaml").write_bytes(b"nominal: {gpu: \xff}")
    with pytest.raises(ConfigError) as info:
        load_config_dir(tmp_path)
    assert info.value.source.endswith("quota-team-a.yaml")
    assert "not UTF-8" in str(info.value)


def test_written_config_dir_loads_back(tmp_path: Path) -> None:
    directory = write_config_dir(tmp_path / "cfg", PLATFORM, {"team-a": QUOTA},
                                 "team-a-dev: {fairgate.io/tenant: team-a}\n")
    config = load_config_dir(directory)
    tenant_a = config.tenant("team-a")
    assert tenant_a is not None and tenant_a.nominal == {"gpu": 8, "mig-1g.5gb": 14}
    assert config.tenant_of_namespace("team-a-dev") == "team-a"


def test_quota_over_64_kib_is_refused_unparsed_naming_size_and_cap() -> None:
    text = "nominal: {gpu: 1}\n" + "#" * (64 * 1024)  # valid YAML, only too long
    with pytest.raises(ConfigError) as info:
        parse_quota(text, "team-a", parse_platform(PLATFORM))
    assert "document is 65,554 bytes, over the 65,536-byte (64 KiB) cap" in str(info.value)
    broken = "x: [" * (1024 * 1024)  # would be a syntax error, if it were parsed
    with pytest.raises(ConfigError, match="over the 65,536-byte"):
        parse_quota(broken, "team-a", parse_platform(PLATFORM))
    padded = "nominal: {gpu: 1}\n" + "#" * (64 * 1024 - 19) + "\n"
    assert len(padded.encode()) == 64 * 1024
    assert parse_quota(padded, "team-a", parse_platform(PLATFORM)).nominal == {"gpu": 1}


def test_platform_documents_keep_the_larger_cap() -> None:
    """platform.yaml (platform admins only) may list hundreds of tenants."""
    tenants = "".join(f"  tenant-{i:04d}: {{weight: 1, ceiling: {{gpuEquivalents: 8}}, "
                      f"admins: {{groups: [tenant-{i:04d}-admins]}}}}\n" for i in range(1000))
    text = "tenants:\n" + tenants
    assert len(text) > 64 * 1024
    assert len(parse_platform(text).tenants) == 1000


@pytest.mark.parametrize("text", [
    "x: " + "[" * 60000 + "]" * 60000,          # libyaml's own composer crashes on this
    "x: " + "{a: " * 20000 + "1" + "}" * 20000,
    "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
])
def test_nesting_and_alias_bombs_are_refused_while_composing(text: str) -> None:
    with pytest.raises(ConfigError, match=r"nested deeper than 32 levels|aliases"):
        parse_quota(text[:60000], "team-a", parse_platform(PLATFORM))


def test_a_quota_of_more_than_1000_values_is_refused_at_the_first_one_past() -> None:
    text = "nominal: {gpu: 1}\nx: [" + ",".join(["1"] * 30000) + "]\n"
    with pytest.raises(ConfigError, match="line 2: YAML not accepted, column 1991: more than "
                                          "1000 YAML values"):
        parse_quota(text, "team-a", parse_platform(PLATFORM))
    assert parse_quota("nominal: {gpu: 1}\n# " + "1," * 30000, "team-a",
                       parse_platform(PLATFORM)).nominal == {"gpu": 1}


@pytest.mark.parametrize("pool", ["a100 pool", "-a100", "a" * 64, "pool/a", ""])
def test_node_pool_must_be_a_label_value(pool: str) -> None:
    text = f"tenants:\n  t: {{weight: 1, ceiling: {{gpuEquivalents: 1}}, nodePool: '{pool}'}}\n"
    with pytest.raises(ConfigError, match="is not a Kubernetes label value"):
        parse_platform(text)
    ok = parse_platform("tenants:\n  t: {weight: 1, ceiling: {gpuEquivalents: 1}, "
                        "nodePool: a100-pool.1}\n")
    assert ok.tenants["t"].node_pool == "a100-pool.1"


def test_platform_capacity_override_is_per_capacity_key() -> None:
    ok = parse_platform("capacity: {gpu: 8, gpu@a100: 4, mig-1g.5gb#single: 56}\n")
    assert ok.capacity == {"gpu": 8, "gpu@a100": 4, "mig-1g.5gb#single": 56}
    with pytest.raises(ConfigError, match="single-strategy nodes offer MIG devices"):
        parse_platform("capacity: {gpu#single: 8}\n")
    with pytest.raises(ConfigError, match="unknown resource"):
        parse_platform("capacity: {tpu: 8}\n")


def test_autoscaling_is_off_unless_configured() -> None:
    spec = parse_platform(PLATFORM).autoscaling
    assert spec.mode == "off" and not spec.enabled and spec.max_capacity == {}


def test_autoscaling_parses_with_capacity_keys() -> None:
    spec = parse_platform(
        "autoscaling: {mode: provisioningRequest, maxCapacity: {gpu: 24, gpu@pool-a: 8},"
        " inFlight: 2}").autoscaling
    assert spec.enabled and spec.mode == "provisioningRequest"
    assert spec.max_capacity == {"gpu": 24, "gpu@pool-a": 8} and spec.in_flight == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("autoscaling: {mode: pending}",
         "autoscaling: autoscaling mode pending needs maxCapacity, the most the GPU pools can "
         "hold, e.g. maxCapacity: {gpu: 64}"),
        ("autoscaling: {mode: pending, maxCapacity: {gpu: 0}}", "needs maxCapacity"),
        ("autoscaling: {mode: karpenter, maxCapacity: {gpu: 8}}",
         "autoscaling.mode: unknown autoscaling mode 'karpenter': write off (the default), "
         "provisioningRequest"),
        ("autoscaling: {mode: pending, maxCapacity: {gpu: 8}, inFlight: 0}",
         "autoscaling.inFlight: inFlight is 0: write 1 or more"),
        ("autoscaling: {mode: pending, maxCapacity: {gpus: 8}}",
         "autoscaling.maxCapacity: 'gpus': unknown resource 'gpus'"),
        ("autoscaling: {mode: pending, maxCapacity: {gpu: -1}}",
         "autoscaling.maxCapacity.gpu: must be 0 or more"),
        ("autoscaling: {mode: pending, maxCapacity: {gpu: 8}, inflight: 2}",
         "autoscaling.inflight: unknown key"),
    ],
)
def test_autoscaling_errors_say_what_to_write(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_platform(text)
    assert expected in str(info.value)


def test_reclaim_is_off_unless_configured() -> None:
    assert parse_platform(PLATFORM).fair_share.reclaim is None


def test_reclaim_parses_durations_and_rate() -> None:
    spec = parse_platform(
        "fairShare: {reclaim: {after: 5m, minRuntime: 30m, perHour: 12}}").fair_share.reclaim
    assert spec is not None
    assert (spec.after, spec.min_runtime, spec.per_hour) == (300.0, 1800.0, 12)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fairShare: {reclaim: {after: 5m, minRuntime: 30m}}",
         "fairShare.reclaim.perHour: Field required"),
        ("fairShare: {reclaim: {after: 5m, minRuntime: 30m, perHour: 0}}",
         "fairShare.reclaim.perHour: perHour is 0: write 1 or more"),
        ("fairShare: {reclaim: {after: soon, minRuntime: 30m, perHour: 2}}",
         "fairShare.reclaim.after: must be a duration such as 1h, 30m, 90s"),
        ("fairShare: {reclaim: {after: 5m, minruntime: 30m, perHour: 2}}",
         "fairShare.reclaim.minruntime: unknown key"),
    ],
)
def test_reclaim_errors_say_what_to_write(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_platform(text)
    assert expected in str(info.value)

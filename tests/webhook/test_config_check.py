"""``fairgate config check DIR``: the verdict ``fairgate serve`` would reach, file by file."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tenants.localdir import load_config_dir
from tenants.schema import ConfigError
from tenants.source import ConfigNotReadyError, start_local_source
from webhook.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "config"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return Path(shutil.copytree(EXAMPLES, tmp_path / "config"))


def _check(directory: Path | str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["config", "check", str(directory)])
    return code, capsys.readouterr().out


def test_a_valid_directory_passes_with_what_each_file_holds(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _check(config, capsys)
    assert code == 0, out
    assert "ok    platform.yaml: 2 tenants: team-a, team-b" in out
    assert "ok    quota-team-b.yaml: tenant team-b, nominal 2.00 GPU-eq" in out
    assert "all 4 files are valid" in out


BROKEN = {
    "quota-team-a.yaml": ("nominal: {gpu: 4}\nborrowLimit: {gpuEquivalents: 1}\nsurprise: 1\n",
                          ["surprise: unknown key"]),
    "quota-team-b.yaml": ("nominal: {gpu: 6}\n", ["nominal: 6.00 GPU-eq exceeds the ceiling"]),
    "quota-team-c.yaml": ("nominal: {gpu: 1}\n", ["tenant 'team-c' is not defined"]),
    "quota_team-d.yaml": ("nominal: {}\n", ["rename it to quota-team-d.yaml"]),
    "namespaces.yaml": ("a: {fairgate.io/tenant: team-a}\nb: {fairgate.io/tenant: team-x}\n",
                        ["b.fairgate.io/tenant: tenant 'team-x' is not defined"]),
}


def test_every_broken_file_and_field_is_named_at_once(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, (text, _) in BROKEN.items():
        (config / name).write_text(text)
    code, out = _check(config, capsys)
    assert code == 1
    assert "ok    platform.yaml" in out
    for name, (_, problems) in BROKEN.items():
        block = out.split(f"error {name}:\n", 1)
        assert len(block) == 2, f"{name} is not reported in:\n{out}"
        for problem in problems:
            assert problem in block[1].split("\n  ok", 1)[0].split("\n  error", 1)[0]
    assert "5 files have errors" in out


def test_a_broken_platform_is_reported_and_quotas_still_checked_on_their_own(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    platform = config / "platform.yaml"
    platform.write_text(platform.read_text() + "tenants: [\n")
    (config / "quota-team-a.yaml").write_text("nominal: {gpu: -1}\n")
    code, out = _check(config, capsys)
    assert code == 1
    assert re.search(r"error platform\.yaml:\n\s+line \d+: YAML syntax error", out), out
    assert "error quota-team-a.yaml:\n          nominal.gpu: must be 0 or more" in out
    assert "checked without platform.yaml" in out


@pytest.mark.parametrize("case", ["missing-dir", "no-platform", *BROKEN])
def test_it_fails_exactly_when_serve_would_refuse_to_start(
    case: str, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if case == "missing-dir":
        target = config / "nowhere"
    elif case == "no-platform":
        (config / "platform.yaml").unlink()
        target = config
    else:
        (config / case).write_text(BROKEN[case][0])
        target = config
    code, out = _check(target, capsys)
    with pytest.raises(ConfigNotReadyError) as refused:
        start_local_source(target, poll_interval=60)
    with pytest.raises(ConfigError) as error:
        load_config_dir(target)
    assert code == 1
    assert Path(error.value.source).name in out
    assert str(error.value.problems[0]) in out
    assert str(error.value.problems[0]) in str(refused.value)


def test_the_help_example_is_what_the_command_prints(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (config / "quota-team-b.yaml").write_text("nominal: {gpu: 6}\n")
    config.rename(config.parent / "my-config")
    monkeypatch.chdir(config.parent)
    code, out = _check("my-config", capsys)
    assert code == 1
    with pytest.raises(SystemExit):
        main(["config", "check", "--help"])
    help_text = capsys.readouterr().out
    example = help_text.split("$ fairgate config check my-config\n", 1)[1].split("$ echo")[0]
    assert " ".join(example.split()) == " ".join(out.split())
    assert help_text.split("$ echo $?\n", 1)[1].split()[0] == str(code)


def test_the_command_line_exits_with_the_verdict(config: Path) -> None:
    command = [sys.executable, "-m", "webhook.cli", "config", "check", str(config)]
    assert subprocess.run(command, capture_output=True, check=False).returncode == 0
    (config / "quota-team-a.yaml").write_text("nominal: {gpu: x}\n")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "quota-team-a.yaml" in done.stdout and "nominal.gpu" in done.stdout

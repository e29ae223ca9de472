"""The ``fairgate`` command line: help that teaches, certificates, clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from webhook.cli import build_parser, main

SUBCOMMANDS = [
    ["demo"], ["certs"], ["certs", "generate"], ["serve"], ["dispatch"], ["status"], ["why"],
    ["audit"], ["audit", "tail"], ["audit", "query"], ["audit", "verify"], ["simulate"],
]
REDIS_COMMANDS = [
    ["serve"], ["dispatch"], ["status"], ["why"], ["audit", "tail"], ["audit", "query"],
    ["audit", "verify"], ["simulate"],
]


@pytest.mark.parametrize("words", SUBCOMMANDS, ids=" ".join)
def test_every_subcommand_has_help_with_examples(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*words, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text
    assert f"fairgate {' '.join(words)}" in text


@pytest.mark.parametrize("words", REDIS_COMMANDS, ids=" ".join)
def test_every_redis_command_takes_redis_url(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*words, "--help"])
    assert "--redis-url" in capsys.readouterr().out


def test_redis_url_defaults_to_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    args = build_parser().parse_args(["status"])
    assert args.redis_url == "redis://127.0.0.1:1/0"


def test_no_subcommand_is_left_unwired() -> None:
    source = (Path(__file__).parents[2] / "webhook" / "cli.py").read_text()
    assert "not available in this build" not in source


def test_certs_generate_writes_a_bundle_naming_the_service(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert main(["certs", "generate", "--out", str(out), "--service", "gate",
                 "--namespace", "gpu", "--san", "127.0.0.1"]) == 0
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = sans.get_values_for_type(x509.DNSName)
    assert {"gate", "gate.gpu", "gate.gpu.svc", "gate.gpu.svc.cluster.local"} <= set(names)
    assert (out / "ca.crt").is_file()
    assert (out / "tls.key").stat().st_mode & 0o077 == 0


def test_serve_with_missing_certificates_says_how_to_fix(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "platform.yaml").write_text("tenants: {}\n")
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "serve", "--cert-dir", str(tmp_path / "nope"),
         "--port", "8443", "--host", "127.0.0.1", "--redis-url", "redis://127.0.0.1:1/0",
         "--config-dir", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "fairgate certs generate" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_broken_config_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "platform.yaml").write_text("tenants: {a: {weight: -1}}\n")
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "serve", "--cert-dir", str(tmp_path),
         "--port", "8443", "--host", "127.0.0.1", "--redis-url", "redis://127.0.0.1:1/0",
         "--config-dir", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "platform.yaml" in result.stderr
    assert "weight" in result.stderr
    assert "Traceback" not in result.stderr

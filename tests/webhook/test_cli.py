"""The ``fairgate`` command line: help that teaches, certificates, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from webhook_helpers import gpu_pod, review

from audit.log import Retention
from fairshare.localredis import local_redis
from webhook.cli import build_parser, main
from webhook.process import ServeProcess

SUBCOMMANDS = [
    ["demo"], ["certs"], ["certs", "generate"], ["serve"], ["dispatch"], ["status"], ["why"],
    ["audit"], ["audit", "tail"], ["audit", "query"], ["audit", "verify"], ["simulate"],
    ["redis-secret"], ["console"], ["certs", "ensure"], ["config"], ["config", "check"],
]
REDIS_COMMANDS = [
    ["serve"], ["dispatch"], ["status"], ["why"], ["audit", "tail"], ["audit", "query"],
    ["audit", "verify"], ["simulate"], ["console"],
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


@pytest.mark.parametrize("words", [*REDIS_COMMANDS, ["demo"]], ids=" ".join)
def test_help_offers_the_password_and_ca_but_never_shows_them(
    words: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:url-secret-1@fairgate-redis:6379/0")
    monkeypatch.setenv("REDIS_PASSWORD", "env-secret-2")
    monkeypatch.setenv("REDIS_PASSWORD_FILE", "/run/secrets/env-secret-3")
    with pytest.raises(SystemExit):
        main([*words, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--redis-password-file" in text and "--redis-ca-file" in text
    assert "$REDIS_PASSWORD" in text
    assert "secret-" not in text


def test_redis_url_defaults_to_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    args = build_parser().parse_args(["status"])
    assert args.redis_url == "redis://127.0.0.1:1/0"


def test_dispatch_takes_a_not_ready_grace_and_status_explains_capacity(
    capsys: pytest.CaptureFixture[str]
) -> None:
    dispatch = ["dispatch", "--redis-url", "redis://fairgate-redis:6379/0"]
    assert build_parser().parse_args(dispatch).not_ready_grace == 40.0
    assert build_parser().parse_args([*dispatch, "--not-ready-grace", "90"]
                                     ).not_ready_grace == 90.0
    for bad in ("0", "soon"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*dispatch, "--not-ready-grace", bad])
        assert "number of seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "nodes left out and why (cordoned, NotReady longer than --not-ready-grace" in text
    assert "held by pods fairgate does not manage" in text


@pytest.mark.parametrize("command", [
    ["dispatch", "--redis-url", "redis://fairgate-redis:6379/0"],
    ["serve", "--redis-url", "redis://fairgate-redis:6379/0", "--cert-dir", "c", "--port", "1"],
])
def test_serve_and_dispatch_take_an_audit_retention(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    assert build_parser().parse_args(command).audit_retention == Retention(
        1_000_000, timedelta(days=45))
    assert build_parser().parse_args([*command, "--audit-retention", "60d,2000000"]
                                     ).audit_retention == Retention(2_000_000, timedelta(days=60))
    for bad in ("0", "45x", "forever", "45d,45d"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*command, "--audit-retention", bad])
        assert "give an age (45d, 12h, 2w), a record count" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([command[0], "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--audit-retention AGE,RECORDS" in text and "default: 45d,1000000" in text


def test_dispatch_takes_an_unschedulable_grace_and_status_explains_what_is_withheld(
    capsys: pytest.CaptureFixture[str]
) -> None:
    dispatch = ["dispatch", "--redis-url", "redis://fairgate-redis:6379/0"]
    assert build_parser().parse_args(dispatch).unschedulable_grace == 60.0
    assert build_parser().parse_args([*dispatch, "--unschedulable-grace", "300"]
                                     ).unschedulable_grace == 300.0
    for bad in ("0", "-5", "inf", "later"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*dispatch, "--unschedulable-grace", bad])
        assert "--unschedulable-grace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["dispatch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a released pod the scheduler reports Unschedulable for longer than this" in text
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "capacity withheld for released pods the scheduler reports Unschedulable" in text


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


# -- commands against a real webhook and Redis -----------------------------------------------


def _fairgate(*args: str, env_redis: str | None = None) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ}
    if env_redis is not None:
        env["REDIS_URL"] = env_redis
    return subprocess.run([sys.executable, "-m", "webhook.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False, env=env)


def _admit(server: ServeProcess, namespace: str, name: str) -> dict[str, Any]:
    body = review(gpu_pod(namespace, name))
    with server.client() as client:
        reply = client.post("/mutate", json=body)
    assert reply.status_code == 200
    response: dict[str, Any] = reply.json()["response"]
    return response


def test_status_shows_what_the_webhook_reserved(server: ServeProcess, redis_url: str) -> None:
    _admit(server, "team-b-dev", "first")
    _admit(server, "team-b-dev", "second")
    result = _fairgate("status", "--json", env_redis=redis_url)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "team-b" in json.dumps(report)
    table = _fairgate("status", "--redis-url", redis_url)
    assert table.returncode == 0
    assert "team-b" in table.stdout


def test_why_explains_a_queued_pod(server: ServeProcess, redis_url: str) -> None:
    _admit(server, "team-b-dev", "holder")
    queued = _admit(server, "team-b-dev", "waiter")
    assert queued["auditAnnotations"]["decision"] == "queue"
    result = _fairgate("why", "team-b-dev/waiter", "--redis-url", redis_url)
    assert result.returncode == 0, result.stderr
    assert "queued" in result.stdout.lower()
    bad = _fairgate("why", "no-slash", "--redis-url", redis_url)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr


def test_why_of_a_pod_fairgate_never_saw_exits_1_saying_so(
    server: ServeProcess, redis_url: str
) -> None:
    _admit(server, "team-b-dev", "known")
    unknown = _fairgate("why", "team-b-dev/no-such-pod", "--redis-url", redis_url)
    assert unknown.returncode == 1
    assert unknown.stdout == ""
    assert unknown.stderr.startswith(
        "fairgate: error: fairgate has no record of team-b-dev/no-such-pod: either it is not "
        "fairgate's business"), unknown.stderr
    as_json = _fairgate("why", "team-b-dev/no-such-pod", "--json", "--redis-url", redis_url)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["verdict"] == "unknown"
    known = _fairgate("why", "team-b-dev/known", "--redis-url", redis_url)
    assert known.returncode == 0, known.stderr


def test_audit_commands_read_and_verify_the_webhooks_records(
    server: ServeProcess, redis_url: str
) -> None:
    denied = _admit(server, "sandbox", "nb")
    assert denied["allowed"] is False
    deadline = time.monotonic() + 5
    query = _fairgate("audit", "query", "--decision", "deny", "--json", "--redis-url", redis_url)
    while '"sandbox"' not in query.stdout and time.monotonic() < deadline:
        time.sleep(0.2)
        query = _fairgate("audit", "query", "--decision", "deny", "--json",
                          "--redis-url", redis_url)
    records = [json.loads(line) for line in query.stdout.splitlines()]
    assert any(r["namespace"] == "sandbox" and r["reason"].startswith(
        "no-tenant: namespace sandbox has no fairgate.io/tenant label") for r in records)
    verify = _fairgate("audit", "verify", "--redis-url", redis_url)
    assert verify.returncode == 0, verify.stdout
    assert verify.stdout.startswith("OK")
    as_json = _fairgate("audit", "verify", "--json", "--redis-url", redis_url)
    assert as_json.returncode == 0, as_json.stderr
    outcome = json.loads(as_json.stdout)
    assert outcome["ok"] is True and outcome["stream"] == "fairgate:audit"
    assert outcome["checked"] >= len(records) and outcome["first_seq"] == 1
    assert outcome["last_seq"] == outcome["checked"]
    assert outcome["first_bad"] is None and outcome["problem"] == ""
    tail = _fairgate("audit", "tail", "--no-follow", "--redis-url", redis_url)
    assert "sandbox" in tail.stdout


def test_simulate_reports_fairness_as_json() -> None:
    trace = Path(__file__).parents[2] / "examples" / "weights-1-2-3.yaml"
    result = _fairgate("simulate", str(trace), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"jain_index", "utilization", "wait_seconds", "tenants"} <= set(report)


_SMALL_TRACE = (
    "capacity: {gpu: 2}\ntenants:\n  team-a: {weight: 1, nominal: {gpu: 2}}\n"
    "  team-b: {weight: 1, nominal: {gpu: 2}}\narrivals:\n"
    "  - {at: 0, tenant: team-a, class: training, demand: {gpu: 1}, duration: 50, count: 8}\n"
    "  - {at: 100, tenant: team-b, class: training, demand: {gpu: 1}, duration: 50, count: 8}\n"
    "horizon: 300\n"
)


def test_simulate_writes_a_timeline_and_a_plot(tmp_path: Path) -> None:
    trace = tmp_path / "small.yaml"
    trace.write_text(_SMALL_TRACE)
    csv_path, png = tmp_path / "t.csv", tmp_path / "t.png"
    result = _fairgate("simulate", str(trace), "--json", "--timeline", str(csv_path),
                       "--timeline-every", "25", "--plot", str(png))
    assert result.returncode == 0, result.stderr
    lines = csv_path.read_text().splitlines()
    assert lines[0] == ("time,tenant,allocated_gpu_eq,entitlement_gpu_eq,inference_gpu_eq,"
                        "training_gpu_eq")
    assert len(lines) == 1 + 2 * 13  # t = 0, 25, ..., 300 for two tenants
    assert "0,team-a,2.0000,2.0000,0.0000,2.0000" in lines
    assert "0,team-b,0.0000,0.0000,0.0000,0.0000" in lines
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000  # a drawn figure, not an empty canvas


def test_simulate_plot_without_matplotlib_says_what_to_install(tmp_path: Path) -> None:
    trace = tmp_path / "small.yaml"
    trace.write_text(_SMALL_TRACE)
    hide = ("import sys; sys.modules['matplotlib'] = None; from webhook.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    result = subprocess.run(
        [sys.executable, "-c", hide, "simulate", str(trace), "--plot", str(tmp_path / "t.png")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 2
    assert "--plot needs matplotlib, which is not installed: pip install 'fairgate[plot]'" \
        in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t.png").exists()


def test_simulate_refuses_a_timeline_step_that_is_not_positive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "t.yaml", "--timeline", "t.csv", "--timeline-every", "0"])
    assert exit_info.value.code == 2
    assert "'0' must be a number of seconds > 0" in capsys.readouterr().err


def test_unreachable_redis_is_a_clear_error() -> None:
    result = _fairgate("audit", "verify", "--redis-url", "redis://127.0.0.1:1/0")
    assert result.returncode == 1
    assert "Redis" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_demo_runs_to_completion_and_cleans_up(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["TMPDIR"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-m", "webhook.cli", "demo"], capture_output=True,
                            text=True, timeout=120, check=False, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    for tenant in ("team-a", "team-b", "team-c", "(no tenant)"):
        assert tenant in result.stdout
    assert "no-tenant" in result.stdout  # the unlabeled namespace was refused
    assert "audit chain:" in result.stdout and "verified" in result.stdout
    cost = result.stdout[result.stdout.index("cost from the verified audit log"):]
    assert "total" in cost and "team-a" in cost and "idle" in cost  # it ends with the bill
    assert list(tmp_path.iterdir()) == []  # certificates, config and logs removed


@pytest.mark.slow
def test_demo_on_a_given_redis_leaves_no_keys_behind(redis_client: Any, redis_url: str) -> None:
    import io

    from rich.console import Console

    from webhook.demo import run_demo

    out = io.StringIO()
    assert run_demo(redis_url, pods=40, console=Console(file=out, width=140)) == 0, out.getvalue()
    assert "verified" in out.getvalue()
    assert redis_client.keys("fairgate:*") == []


def test_demo_refuses_a_redis_holding_fairgate_state(redis_client: Any, redis_url: str) -> None:
    import io

    from rich.console import Console

    from webhook.demo import run_demo

    redis_client.set("fairgate:live-deployment", "precious")
    out = io.StringIO()
    assert run_demo(redis_url, console=Console(file=out, width=140)) == 2
    assert "already holds fairgate keys" in out.getvalue()
    assert redis_client.get("fairgate:live-deployment") == b"precious"


@pytest.mark.parametrize("command", [
    ["serve", "--cert-dir", "certs", "--port", "8443"],
    ["dispatch"],
])
def test_cluster_mode_without_a_cluster_says_how_to_fix(
    command: list[str], tmp_path: Path
) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(tmp_path / "missing-kubeconfig")
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", *command, "--redis-url", "redis://127.0.0.1:1/0"],
        capture_output=True, text=True, timeout=60, check=False, env=env, cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "KUBECONFIG" in result.stderr
    assert "Traceback" not in result.stderr


def test_certs_ensure_without_a_cluster_says_how_to_fix(tmp_path: Path) -> None:
    """The console's TLS sidecar command outside a cluster: one line that says what to
    do, exit 1 (a runtime error), nothing written."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(tmp_path / "missing-kubeconfig")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # this checkout's fairgate
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "certs", "ensure", "--secret", "fairgate-console-tls",
         "--service", "fairgate-console", "--cert-dir", str(tmp_path / "tls")],
        capture_output=True, text=True, timeout=60, check=False, env=env, cwd=tmp_path,
    )
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("fairgate: error: cannot ensure Secret "
                           "fairgate-system/fairgate-console-tls")
    assert "KUBECONFIG" in line
    assert not (tmp_path / "tls").exists()


@pytest.mark.parametrize("argv", [
    ["status", "--redis-url", "http://127.0.0.1:6379"],
    ["serve", "--cert-dir", "c", "--port", "99999", "--redis-url", "redis://127.0.0.1:1/0"],
    ["demo", "--pods", "0"],
])
def test_bad_arguments_are_usage_errors_that_say_what_is_wrong(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument" in err
    assert "Traceback" not in err


# -- Redis password and TLS on the command line ---------------------------------------------

SECRET = "cli-" + "9f3e1c55d0b84a47"


@pytest.fixture(scope="module")
def locked_redis_url() -> Any:
    from fairshare.localredis import local_redis

    with local_redis(password=SECRET) as url:
        yield url


@pytest.mark.parametrize("how", ["file", "environment", "url"])
def test_every_password_source_reaches_redis(
    how: str, locked_redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("REDIS_PASSWORD", raising=False)
    monkeypatch.delenv("REDIS_PASSWORD_FILE", raising=False)
    url, extra = locked_redis_url, []
    if how == "file":
        (tmp_path / "password").write_text(SECRET + "\n")
        extra = ["--redis-password-file", str(tmp_path / "password")]
    elif how == "environment":
        monkeypatch.setenv("REDIS_PASSWORD", SECRET)
    else:
        url = url.replace("redis://", f"redis://:{SECRET}@")
    assert main(["status", "--json", "--redis-url", url, *extra]) == 0
    assert main(["audit", "verify", "--redis-url", url, *extra]) == 0
    assert SECRET not in capsys.readouterr().out


@pytest.mark.parametrize("command", [["status"], ["why", "ns/pod"], ["audit", "verify"]],
                         ids=" ".join)
def test_a_wrong_password_is_a_clear_error_that_does_not_echo_it(
    command: list[str], locked_redis_url: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wrong = "cli-wrong-7d1a"
    monkeypatch.setenv("REDIS_PASSWORD", wrong)
    assert main([*command, "--redis-url", locked_redis_url]) == 1
    err = capsys.readouterr().err
    assert "fairgate: error:" in err and "Traceback" not in err
    assert wrong not in err and SECRET not in err
    if command == ["audit", "verify"]:
        assert "--redis-password-file" in err  # says how to fix it
    url = locked_redis_url.replace("redis://", f"redis://:{wrong}@")
    assert main([*command, "--redis-url", url]) == 1
    err = capsys.readouterr().err
    assert wrong not in err and "***" in err


def test_a_bad_url_is_refused_without_echoing_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["status", "--redis-url", "http://admin:cli-url-secret@redis:6379"])
    err = capsys.readouterr().err
    assert "is not a Redis URL" in err and "cli-url-secret" not in err


def test_redis_over_tls_needs_the_ca_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from certs import write_bundle
    from fairshare.localredis import local_redis

    write_bundle(tmp_path, service="fairgate-redis", extra_sans=("127.0.0.1",))
    monkeypatch.setenv("REDIS_PASSWORD", SECRET)
    with local_redis(password=SECRET, tls_dir=tmp_path) as url:
        assert url.startswith("rediss://")
        assert main(["audit", "verify", "--redis-url", url,
                     "--redis-ca-file", str(tmp_path / "ca.crt")]) == 0
        capsys.readouterr()
        assert main(["audit", "verify", "--redis-url", url]) == 1
        err = capsys.readouterr().err
        assert "--redis-ca-file" in err and SECRET not in err


@pytest.mark.parametrize("command", ["serve", "console", "dispatch"])
def test_a_missing_config_dir_is_one_clear_error_and_exit_2(
        tmp_path: Path, command: str) -> None:
    """Nothing says it serves first, nothing speaks of a last good version there never
    was, nothing names a doc that does not exist; each command exits 2."""
    extra = {"serve": ["--cert-dir", str(tmp_path), "--port", "8443", "--host", "127.0.0.1"],
             "console": ["--port", "0"], "dispatch": []}[command]
    with local_redis() as url:
        result = subprocess.run(
            [sys.executable, "-m", "webhook.cli", command, *extra, "--redis-url", url,
             "--config-dir", str(tmp_path / "config")],
            capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert f"fairgate: error: cannot load the config in {tmp_path / 'config'}: " \
        f"{tmp_path / 'config'}: directory not found: give --config-dir the directory " \
        "holding platform.yaml" in result.stderr
    for wrong in ("serving", "last good", "docs/configuration.md", "Traceback"):
        assert wrong not in output


def test_a_redis_that_wants_a_password_none_was_given_for_says_where_to_give_it(
        tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "REDIS_PASSWORD", "REDIS_PASSWORD_FILE")}
    hint = ("it requires a password and none was given: give it with --redis-password-file "
            "PATH, $REDIS_PASSWORD or redis://:PASSWORD@HOST in the URL")
    with local_redis(password="s3cret-pass") as url:
        for args in (["status"], ["why", "team-a-dev/p"], ["audit", "verify"], ["report"],
                     ["console", "--port", "0"]):
            result = subprocess.run(
                [sys.executable, "-m", "webhook.cli", *args, "--redis-url", url],
                capture_output=True, text=True, timeout=60, check=False, env=env)
            assert result.returncode == 1, (args, result.stderr)
            assert result.stderr.startswith(f"fairgate: error: cannot reach Redis at {url} ")
            assert result.stderr.rstrip().endswith(hint), (args, result.stderr)
        env["REDIS_PASSWORD"] = "not-it"
        wrong = subprocess.run([sys.executable, "-m", "webhook.cli", "status", "--redis-url", url],
                               capture_output=True, text=True, timeout=60, check=False, env=env)
    assert "it refused the password: give it with --redis-password-file" in wrong.stderr
    assert "not-it" not in wrong.stderr


def test_version_prints_the_installed_package_version(
        capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"fairgate {importlib.metadata.version('fairgate')}\n"


def test_audit_query_refuses_an_unknown_decision_listing_every_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    from audit import DECISIONS

    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "query", "--decision", "bogus", "--redis-url", "redis://127.0.0.1:1/0"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'bogus' (choose from " + ", ".join(
        repr(d) for d in DECISIONS) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["audit", "query", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "only this decision: " + ", ".join(DECISIONS) in help_text


def test_a_trace_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    trace = tmp_path / "latin1.yaml"
    trace.write_bytes(_SMALL_TRACE.encode() + b"# caf\xe9\n")
    result = subprocess.run([sys.executable, "-m", "webhook.cli", "simulate", str(trace)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert f"fairgate: error: {trace}: not UTF-8 text (byte " in result.stderr
    assert "save it as UTF-8" in result.stderr and "Traceback" not in result.stderr


def test_certs_generate_refuses_to_write_into_a_python_package(tmp_path: Path) -> None:
    """From fairgate's source tree ``--out ./certs`` is the certs package itself."""
    root = Path(__file__).resolve().parents[2]
    before = sorted(p.name for p in (root / "certs").iterdir())
    result = subprocess.run([sys.executable, "-m", "webhook.cli", "certs", "generate",
                             "--out", "./certs"], capture_output=True, text=True, timeout=60,
                            check=False, cwd=root)
    assert result.returncode == 2
    assert result.stderr.startswith("fairgate: error: certs is a Python package (it holds "
                                    "__init__.py")
    assert "choose another --out" in result.stderr
    assert sorted(p.name for p in (root / "certs").iterdir()) == before
    elsewhere = main(["certs", "generate", "--out", str(tmp_path / "certs")])
    assert elsewhere == 0 and (tmp_path / "certs" / "ca.key").is_file()


def test_a_denial_explains_itself_in_the_audit_log_and_in_why(
    server: ServeProcess, redis_url: str
) -> None:
    body = review(gpu_pod("team-b-dev", "big", limits={"nvidia.com/gpu": "2"}))
    with server.client() as client:
        response = client.post("/mutate", json=body).json()["response"]
    told = response["status"]["message"]
    assert response["allowed"] is False
    assert told.startswith("pod asks for gpu=2 (2.00 GPU-eq) but team-b may hold at most")
    assert response["auditAnnotations"]["reason"] == "never-fits"  # the API server's: a tag
    deadline = time.monotonic() + 5
    records: list[dict[str, Any]] = []
    while not records and time.monotonic() < deadline:
        query = _fairgate("audit", "query", "--decision", "deny", "--json", env_redis=redis_url)
        records = [r for r in map(json.loads, query.stdout.splitlines()) if r["name"] == "big"]
        time.sleep(0.1)
    (record,) = records
    assert (record["class"], record["demand"]) == ("training", "gpu=2")
    assert record["reason"] == f"never-fits: {told}"
    why = _fairgate("why", "team-b-dev/big", env_redis=redis_url)
    assert why.returncode == 0, why.stderr
    assert f"denied at admission: {told} (never-fits)" in " ".join(why.stdout.split())
    answer = json.loads(_fairgate("why", "team-b-dev/big", "--json", env_redis=redis_url).stdout)
    assert answer["summary"] == f"denied at admission: {told} (never-fits)"
    assert (answer["class"], answer["demand"]) == ("training", "gpu=2")


def test_the_demo_runtime_is_stated_one_way(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's quick start, ``fairgate --help`` and ``fairgate demo --help`` say how
    long the demo takes in the same words, which name the demo's virtual hours, and no
    other duration (the demo prints what it took: tests/webhook/test_first_run.py)."""
    import re

    from webhook.cli import DEMO_RUNTIME
    from webhook.demo import HORIZON

    assert f"{HORIZON / 3600:g} virtual hours" in DEMO_RUNTIME
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    texts = {"README.md quick start": quick_start}
    for words in ([], ["demo"]):
        with pytest.raises(SystemExit):
            main([*words, "--help"])
        texts["fairgate " + " ".join([*words, "--help"])] = capsys.readouterr().out
    duration = re.compile(r"\b(?:about|under|in|takes) (?:a minute|a few seconds|\d+ ?s)\b")
    for where, text in texts.items():
        flat = " ".join(text.split())
        assert DEMO_RUNTIME in flat, where
        assert duration.findall(flat.replace(DEMO_RUNTIME, "")) == [], where


def test_report_and_audit_query_take_the_same_times_in_the_same_words(
    capsys: pytest.CaptureFixture[str]
) -> None:
    """``--since``/``--until`` mean the same in both: one metavar, one help wording (only
    the default start differs), one parser (the same error for a bad time, exit 2)."""
    helps = {}
    for words in (["report"], ["audit", "query"]):
        with pytest.raises(SystemExit):
            main([*words, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "[--since TIME] [--until TIME]" in text
        assert ("TIME is RFC 3339 (2026-01-31T12:00:00Z), a date (2026-01-31, UTC) or an age "
                "before now (30s, 15m, 2h, 7d, 1w).") in text
        assert "WHEN" not in text
        helps[words[0]] = text
    for text in helps.values():
        assert ("--since TIME from TIME on, inclusive: RFC 3339, a date (UTC) or an age such "
                "as 7d (default: ") in text
        assert ("--until TIME up to TIME, exclusive: RFC 3339, a date (UTC) or an age such "
                "as 7d (default and at most: now)") in text


def test_dispatch_help_describes_the_order_by_virtual_time(
    capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["dispatch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "lowest share / weight" not in text
    assert "inference before training; then the tenant with the lowest virtual time" in text
    assert "idle time earns no credit" in text
    assert "A gang is released whole or not at all" in text


def _camel_keys(data: Any, where: str = "") -> list[str]:
    """The keys in ``data`` (nested) with a capital letter: not snake_case. OpenCost's own
    names, under ``opencost``, are OpenCost's."""
    if isinstance(data, list):
        return [bad for i, item in enumerate(data) for bad in _camel_keys(item, f"{where}[{i}]")]
    if not isinstance(data, dict):
        return []
    found = []
    for key, value in data.items():
        if any(c.isupper() for c in key):
            found.append(f"{where}.{key}")
        if key != "opencost":
            found += _camel_keys(value, f"{where}.{key}")
    return found


def test_every_json_output_names_its_fields_in_snake_case(
    server: ServeProcess, redis_url: str, tmp_path: Path
) -> None:
    """status, why, audit query and verify, report and simulate: one style of field names
    (snake_case, as the simulation's and the report's documented keys)."""
    _admit(server, "team-b-dev", "holder")
    assert _admit(server, "team-b-dev", "waiter")["auditAnnotations"]["decision"] == "queue"
    _admit(server, "sandbox", "nb")
    trace = tmp_path / "small.yaml"
    trace.write_text(_SMALL_TRACE)
    outputs = {
        "status": _fairgate("status", "--json", env_redis=redis_url),
        "why": _fairgate("why", "team-b-dev/waiter", "--json", env_redis=redis_url),
        "audit query": _fairgate("audit", "query", "--json", env_redis=redis_url),
        "audit verify": _fairgate("audit", "verify", "--json", env_redis=redis_url),
        "report": _fairgate("report", "--json", env_redis=redis_url),
        "simulate": _fairgate("simulate", str(trace), "--json", "--window", "100:"),
    }
    for command, done in outputs.items():
        assert done.returncode == 0, (command, done.stderr)
        documents = [json.loads(line) for line in done.stdout.splitlines() if line.strip()] \
            if command == "audit query" else [json.loads(done.stdout)]
        assert documents, command
        for document in documents:
            assert _camel_keys(document) == [], (command, document)
    status = json.loads(outputs["status"].stdout)
    why = json.loads(outputs["why"].stdout)
    assert {"jain_index", "capacity_by_class", "capacity_notes", "held"} <= set(status)
    assert {"borrow_limit", "weighted_share", "of_entitlement"} <= set(
        status["tenants"]["team-b"])
    assert why["queue_length"] == status["tenants"]["team-b"]["queued"]["training"]

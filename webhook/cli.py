"""The ``fairgate`` command.

Contract: ``main(argv) -> exit code``. Every subcommand has ``--help`` with examples;
every subcommand that talks to Redis takes ``--redis-url`` (default ``$REDIS_URL``).
Bad input (missing files, broken config, unreachable Redis) ends with a one-line
``fairgate: error: ...`` on stderr that says what to fix, and exit code 2 (usage) or
1 (runtime), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from audit import DECISIONS
from audit.log import DEFAULT_RETENTION, MAX_AGE, MAXLEN, Retention
from certs import CertError, write_bundle
from fairshare.cluster.cluster import DEFAULT_NOT_READY_GRACE, DEFAULT_UNSCHEDULABLE_GRACE
from fairshare.connection import (
    COMMAND_TIMEOUT,
    PASSWORD_ENV,
    RedisSettingsError,
    RedisTarget,
    check_url,
    connect_redis,
)
from fairshare.queue.budget import DEFAULT_BUDGET_EVERY
from fairshare.queue.fastpath import REPLICA_ACK_TIMEOUT
from tenants.models import CONTROL_NAMESPACE
from tenants.schema import ConfigError
from webhook.connections import CONSOLE_LIMITS, DEFAULT_LIMITS, ConnectionLimits
from webhook.metrics import TENANT_LABELS

Handler = Callable[[argparse.Namespace], int]

DEMO_RUNTIME = "about 10 s for 4 virtual hours"
"""How long ``fairgate demo`` takes (with its default pods), in the words every text uses
(this help, ``fairgate demo --help`` and the README); the demo prints what it took."""

_EPILOG_MAIN = f"""\
examples:
  fairgate demo                                   # everything, locally: {DEMO_RUNTIME}
  fairgate simulate examples/weights-1-2-3.yaml --json
  export REDIS_URL=redis://127.0.0.1:6379/0       # the Redis of the commands below
  fairgate certs generate --out ./tls
  fairgate config check examples/config           # what serve would say of the config
  fairgate serve --cert-dir ./tls --port 8443 --config-dir examples/config
  fairgate status
  fairgate why team-a-dev/trainer-0
  fairgate audit verify
  fairgate report --since 2026-03-01 --until 2026-04-01

Run `fairgate <command> --help` for the details of a command.
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in epilogs as written."""


def _redis_url(text: str) -> str:
    try:
        return check_url(text)
    except RedisSettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _env_state(name: str) -> str:
    return "set" if os.environ.get(name) else "not set"


def _redis_url_argument(
    parser: argparse.ArgumentParser, *, required: bool = True, purpose: str | None = None
) -> None:
    """``--redis-url`` with its password and TLS companions; :func:`main` resolves the
    three into ``args.redis`` (a :class:`RedisTarget`, or None without a URL)."""
    default = os.environ.get("REDIS_URL")
    parser.add_argument(
        "--redis-url",
        type=_redis_url,
        default=default,
        required=required and default is None,
        metavar="URL",
        help=(purpose or "Redis holding fairgate's queue and audit stream")
        + ", e.g. redis://127.0.0.1:6379/0 or rediss://fairgate-redis:6379/0 for TLS; "
        "redis://[USER]:PASSWORD@HOST:PORT/DB also works; through Redis Sentinel: "
        "redis+sentinel://HOST:PORT,HOST:PORT/MASTER[/DB] (default: $REDIS_URL, which is "
        + _env_state("REDIS_URL") + ")",
    )
    parser.add_argument(
        "--redis-password-file",
        type=Path,
        default=os.environ.get("REDIS_PASSWORD_FILE"),
        metavar="PATH",
        help="file holding the Redis password, e.g. a mounted Secret key (default: "
        "$REDIS_PASSWORD_FILE, which is " + _env_state("REDIS_PASSWORD_FILE")
        + "); without it and without a password in the URL, $" + PASSWORD_ENV
        + " is used (" + _env_state(PASSWORD_ENV) + ")",
    )
    parser.add_argument(
        "--redis-ca-file",
        type=Path,
        default=os.environ.get("REDIS_CA_FILE"),
        metavar="PATH",
        help="PEM CA that must have signed the certificate of a rediss:// server "
        "(default: $REDIS_CA_FILE, which is " + _env_state("REDIS_CA_FILE")
        + "; unset: the system's CAs)",
    )


def _resolve_redis(args: argparse.Namespace) -> None:
    """Set ``args.redis`` from ``--redis-url`` and its companions (see
    :meth:`RedisTarget.resolve`); raises :class:`RedisSettingsError`."""
    if not hasattr(args, "redis_url"):
        return
    args.redis = None if args.redis_url is None else RedisTarget.resolve(
        args.redis_url, password_file=args.redis_password_file, ca_file=args.redis_ca_file
    )


def _subparser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str,
    examples: str,
) -> argparse.ArgumentParser:
    return subparsers.add_parser(
        name,
        help=summary,
        description=description,
        epilog="examples:\n" + examples,
        formatter_class=_Formatter,
    )


# -- certs -----------------------------------------------------------------------------


def _certs_generate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if (out / "__init__.py").exists():
        print(f"fairgate: error: {out} is a Python package (it holds __init__.py; from "
              "fairgate's own source tree, ./certs is fairgate's certs package): a CA key "
              "does not belong there, choose another --out, e.g. --out ./tls",
              file=sys.stderr)
        return 2
    paths = write_bundle(out, args.service, args.namespace, tuple(args.san))
    print(f"wrote {paths.ca_cert}, {paths.cert}, {paths.key} (and {paths.ca_key}, keep it private)")
    print(f"caBundle for the webhook configurations: base64 of {paths.ca_cert}")
    return 0


def _certs_ensure(args: argparse.Namespace) -> int:
    import logging
    import threading

    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from certs.bootstrap import BootstrapError, WebhookTarget, ensure_certificates
    from tenants.cluster import api_client_from_environment

    target = WebhookTarget(namespace=args.namespace, service=args.service,
                           secret_name=args.secret, extra_sans=tuple(args.san),
                           component=args.component)
    where = f"Secret {args.namespace}/{args.secret}"
    try:
        api = api_client_from_environment()
        bundle = ensure_certificates(api, target, Path(args.cert_dir))
    except (ConfigException, BootstrapError, CertError, HTTPError, OSError) as exc:
        print(f"fairgate: error: cannot ensure {where} ({type(exc).__name__}: {exc}): "
              "run in the cluster or set KUBECONFIG", file=sys.stderr)
        return 1
    print(f"{where}: serving certificate for {args.service}.{args.namespace}.svc until "
          f"{bundle.cert.not_valid_after_utc:%Y-%m-%d}, written to {args.cert_dir}", flush=True)
    if args.every is None:
        return 0
    from certs.bootstrap import maintain_certificates

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Runs until the pod stops it (SIGTERM ends the process).
    maintain_certificates(api, target, Path(args.cert_dir), stop=threading.Event(),
                          interval=args.every)
    return 0


def _add_certs(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = _subparser(
        subparsers, "certs", "create the webhook's CA and serving certificate",
        "Certificates for the webhook's HTTPS endpoint.",
        "  fairgate certs generate --out ./tls\n",
    )
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="COMMAND")
    gen = _subparser(
        certs_sub, "generate", "write ca.crt, tls.crt, tls.key (ECDSA P-256) into a directory",
        "Generate a new CA and a serving certificate whose SANs name the webhook Service:\n"
        "<svc>, <svc>.<ns>, <svc>.<ns>.svc, <svc>.<ns>.svc.cluster.local (plus --san).\n"
        "Writes ca.crt (the caBundle), ca.key (keep private), tls.crt and tls.key.\n"
        "In a cluster, `fairgate serve` creates and renews these itself.",
        "  fairgate certs generate --out ./tls\n"
        "  fairgate certs generate --out ./tls --service gpu-gate --namespace platform\n"
        "  fairgate certs generate --out ./tls --san localhost --san 127.0.0.1\n",
    )
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    gen.add_argument("--service", default="fairgate-webhook",
                     help="webhook Service name (default: %(default)s)")
    gen.add_argument("--namespace", default="fairgate-system",
                     help="namespace of the Service (default: %(default)s)")
    gen.add_argument("--san", action="append", default=[], metavar="NAME",
                     help="extra DNS name or IP address for the certificate (repeatable)")
    gen.set_defaults(handler=_certs_generate)
    ensure = _subparser(
        certs_sub, "ensure", "keep a certificate Secret in the cluster and its files in a dir",
        "Make sure the kubernetes.io/tls Secret --secret in --namespace holds a CA and a\n"
        "serving certificate for the Service --service (created when absent, renewed\n"
        "with two-thirds of its lifetime gone or when its names no longer match), and\n"
        "write ca.crt, ca.key, tls.crt and tls.key into --cert-dir. Safe from many pods\n"
        "at once: they end up with one CA. With --every it stays running and does this\n"
        "again every SECONDS (the console's TLS sidecar). `fairgate serve` does the same\n"
        "for the webhook by itself.",
        "  fairgate certs ensure --secret fairgate-console-tls --service fairgate-console \\\n"
        "      --cert-dir /etc/fairgate/console-tls\n"
        "  fairgate certs ensure --secret fairgate-console-tls --service fairgate-console \\\n"
        "      --cert-dir /etc/fairgate/console-tls --every 3600\n",
    )
    ensure.add_argument("--secret", required=True, help="name of the kubernetes.io/tls Secret")
    ensure.add_argument("--service", required=True,
                        help="the Service the certificate names (its DNS names are the SANs)")
    ensure.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", CONTROL_NAMESPACE),
                        help="namespace of the Secret and the Service (default: $POD_NAMESPACE "
                        f"or {CONTROL_NAMESPACE})")
    ensure.add_argument("--cert-dir", required=True, metavar="DIR",
                        help="directory to write the four PEM files into")
    ensure.add_argument("--san", action="append", default=[], metavar="NAME",
                        help="extra DNS name or IP address for the certificate (repeatable)")
    ensure.add_argument("--component", default="console-tls",
                        help="the Secret's app.kubernetes.io/component label "
                        "(default: %(default)s)")
    ensure.add_argument("--every", type=_positive_seconds, metavar="SECONDS",
                        help="keep running and check again every SECONDS")
    ensure.set_defaults(handler=_certs_ensure)


def _redis_secret(args: argparse.Namespace) -> int:
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from certs.bootstrap import BootstrapError
    from certs.redis_secret import DEFAULT_REDIS_SECRET, ensure_redis_secret
    from tenants.cluster import api_client_from_environment

    name = args.name or DEFAULT_REDIS_SECRET
    try:
        outcome = ensure_redis_secret(api_client_from_environment(), args.namespace, name)
    except (ConfigException, BootstrapError, HTTPError) as exc:
        print(f"fairgate: error: cannot ensure Secret {args.namespace}/{name} "
              f"({type(exc).__name__}: {exc}): run in the cluster or set KUBECONFIG",
              file=sys.stderr)
        return 1
    print(f"Secret {args.namespace}/{name}: {outcome}")
    return 0


def _add_redis_secret(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    secret = _subparser(
        subparsers, "redis-secret", "create the Redis password Secret if it is missing",
        "Make sure the Secret holding Redis's password exists: create it with a random\n"
        "password (key `password`) and the matching Redis ACL file (key `users.acl`,\n"
        "the password only as its SHA-256) when absent; rewrite `users.acl` when it does\n"
        "not match `password` (after you set your own). Never prints the password.\n"
        "The webhook's init container runs this; see docs/install.md.",
        "  fairgate redis-secret\n"
        "  fairgate redis-secret --namespace platform --name my-redis-auth\n",
    )
    secret.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", CONTROL_NAMESPACE),
                        help="namespace of the Secret (default: $POD_NAMESPACE or "
                        f"{CONTROL_NAMESPACE})")
    secret.add_argument("--name", help="name of the Secret (default: fairgate-redis-auth)")
    secret.set_defaults(handler=_redis_secret)


# -- serve -----------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from webhook.logs import configure_logging
    from webhook.server import ServeError, ServeOptions, serve

    configure_logging(args.log_level)
    options = ServeOptions(
        cert_dir=Path(args.cert_dir),
        port=args.port,
        redis=args.redis,
        config_dir=Path(args.config_dir) if args.config_dir else None,
        host=args.host,
        workers=args.workers,
        log_level=args.log_level,
        wait_for_rebuild=args.wait_for_rebuild,
        replica_acks=args.replica_acks,
        replica_ack_timeout=args.replica_ack_timeout,
        audit_retention=args.audit_retention,
        connections=_connection_limits(args),
        clock_file=Path(args.clock_file) if args.clock_file else None,
        metrics_tenant_labels=args.metrics_tenant_labels,
    )
    try:
        serve(options)
    except ServeError as exc:
        print(f"fairgate: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds > 0")
    return value


def _window(text: str) -> tuple[float, float | None]:
    """``FROM:TO`` seconds, 0 <= FROM < TO (either side may be empty: 0, the horizon)."""
    start_text, colon, end_text = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"{text!r} is not FROM:TO (seconds, e.g. 1800:7200)")
    try:
        start = float(start_text) if start_text.strip() else 0.0
        end = float(end_text) if end_text.strip() else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: FROM and TO must be seconds") from None
    if not (0 <= start < math.inf) or (end is not None and not (start < end < math.inf)):
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 <= FROM < TO, in finite seconds")
    return start, end


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range 1-65535")
    return value


def _retention(text: str) -> Retention:
    try:
        return Retention.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _audit_retention_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--audit-retention", type=_retention, default=DEFAULT_RETENTION, metavar="AGE,RECORDS",
        help="what the audit stream keeps, trimmed at each append: records younger than "
        "AGE (45d, 12h, 2w; 'none': any age) and at most RECORDS, either or both (default: "
        f"{MAX_AGE.days}d,{MAXLEN}: a month's bill stays complete for `fairgate report` up "
        "to ~22,000 records a day, 550-630 bytes each in Redis: raise Redis's memory limit "
        "with RECORDS); give every writer (serve and dispatch) the same")


def _add_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = _subparser(
        subparsers, "serve", "run the admission webhook over HTTPS",
        "Serve /mutate, /validate, /healthz, /readyz and /metrics over TLS 1.2+.\n"
        "The serving certificate (tls.crt, tls.key in --cert-dir) is reloaded when it\n"
        "changes. With --config-dir the tenant config is read from that directory\n"
        "(platform.yaml, quota-<tenant>.yaml, namespaces.yaml); without it, from the\n"
        "cluster's ConfigMaps and Namespaces. SIGTERM finishes requests in flight.",
        "  fairgate serve --cert-dir ./tls --port 8443 --redis-url redis://127.0.0.1:6379/0 "
        "--config-dir examples/config\n"
        "  REDIS_URL=redis://fairgate-redis:6379/0 fairgate serve --cert-dir /certs --port 8443\n"
        "  fairgate serve --cert-dir /certs --port 8443 --workers 2   # two processes\n",
    )
    serve.add_argument("--cert-dir", required=True, metavar="DIR",
                       help="directory holding tls.crt and tls.key (see `fairgate certs`)")
    serve.add_argument("--port", required=True, type=_port, help="HTTPS port, e.g. 8443")
    _redis_url_argument(serve)
    serve.add_argument("--config-dir", metavar="DIR",
                       help="local config directory (default: read the config from the cluster)")
    serve.add_argument("--host", default="0.0.0.0",
                       help="address to listen on (default: %(default)s)")
    serve.add_argument("--workers", type=_positive, default=1, metavar="N",
                       help="worker processes sharing the port (default: %(default)s); "
                       "use about one per CPU core the webhook may use")
    serve.add_argument("--wait-for-rebuild", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="reserve nothing until `fairgate dispatch` has rebuilt usage from "
                       "the cluster after Redis started empty (quota stays safe across a "
                       "Redis loss): GPU pods queue meanwhile (default: on when the config "
                       "comes from the cluster, off with --config-dir)")
    serve.add_argument("--replica-acks", type=_count, default=None, metavar="N",
                       help="answer a reservation only once N Redis replicas hold it "
                       "(WAIT); if they do not within --replica-ack-timeout, "
                       "onRedisUnavailable decides (default: 1 with a redis+sentinel:// "
                       "URL, 0 otherwise)")
    serve.add_argument("--replica-ack-timeout", type=_positive_seconds,
                       default=REPLICA_ACK_TIMEOUT,
                       metavar="SECONDS",
                       help="how long to wait for the replicas (default: %(default)s; "
                       "below the 0.5 s Redis timeout)")
    serve.add_argument("--metrics-tenant-labels", choices=TENANT_LABELS, default="none",
                       help="how /metrics shows tenants: none (no tenant label) or names "
                       "(decisions counted by tenant name; anyone who can reach --port can "
                       "read them, so first admit only the API server and Prometheus to it) "
                       "(default: %(default)s)")
    _audit_retention_argument(serve)
    serve.add_argument("--clock-file", help=argparse.SUPPRESS)  # fairgate demo's virtual time
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"],
                       help="log level (default: %(default)s)")
    _connection_arguments(serve, DEFAULT_LIMITS)
    serve.set_defaults(handler=_serve)


def _connection_arguments(parser: argparse.ArgumentParser, limits: ConnectionLimits) -> None:
    parser.add_argument("--max-connections", type=_positive, default=limits.max_connections,
                        metavar="N",
                        help="connections kept open at once (per worker); more are "
                        "answered 503 and closed (default: %(default)s)")
    parser.add_argument("--request-timeout", type=_positive_seconds,
                        default=limits.request_seconds, metavar="SECONDS",
                        help="a request (headers and body) must arrive within this many "
                        "seconds of its first byte, else its connection is closed "
                        "(default: %(default)g)")


def _connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    return ConnectionLimits(args.max_connections, args.request_timeout)


# -- demo ------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from webhook.demo import run_demo

    return run_demo(redis_url=args.redis, pods=args.pods, web_console=args.console)


def _add_demo(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = _subparser(
        subparsers, "demo", "see fairgate work end to end on this machine, no cluster",
        "Start redis-server (unless REDIS_URL is set), generate certificates, write a\n"
        "config for three tenants, run `fairgate serve` over HTTPS and send it a mixed\n"
        "stream of real AdmissionReview requests (inference and training, whole GPUs and\n"
        "MIG, a gang, over-quota pods, an unlabeled namespace), then print per tenant\n"
        "what was admitted, queued and denied. Cleans up after itself. Takes\n"
        f"{DEMO_RUNTIME} (more pods take longer).",
        "  fairgate demo\n  fairgate demo --console   # then open the printed URL\n"
        "  REDIS_URL=redis://127.0.0.1:6379/1 fairgate demo   # a Redis with no fairgate keys\n",
    )
    _redis_url_argument(demo, required=False,
                        purpose="use this Redis (it must hold no fairgate keys) instead of "
                        "starting one")
    demo.add_argument("--pods", type=_positive, default=120,
                      help="how many pod admissions to send (default: %(default)s)")
    demo.add_argument("--console", action="store_true",
                      help="after the table, keep the stack running and serve `fairgate "
                      "console` on it (http://127.0.0.1:8080/?token=..., printed) until Ctrl-C")
    demo.set_defaults(handler=_demo)


# -- audit -----------------------------------------------------------------------------


def _redis_client(args: argparse.Namespace) -> redis.Redis:
    client = connect_redis(args.redis, COMMAND_TIMEOUT)
    client.ping()
    return client


def _audit_tail(args: argparse.Namespace) -> int:
    from audit import commands

    return commands.tail(_redis_client(args), sys.stdout, last=args.last, follow=args.follow)


def _audit_query(args: argparse.Namespace) -> int:
    from audit import commands

    return commands.query(
        _redis_client(args), sys.stdout, tenant=args.tenant, decision=args.decision,
        user=args.user, since=args.since, until=args.until, as_json=args.json,
    )


def _audit_verify(args: argparse.Namespace) -> int:
    from audit import commands

    return commands.verify(_redis_client(args), sys.stdout, as_json=args.json)


TIME_FORMATS = ("TIME is RFC 3339 (2026-01-31T12:00:00Z), a date (2026-01-31, UTC) or an\n"
                "age before now (30s, 15m, 2h, 7d, 1w).")
"""The times ``--since`` and ``--until`` take (:func:`audit.query.parse_when`), in the
words of every help that has them."""


def _time_arguments(parser: argparse.ArgumentParser, *, since_default: str) -> None:
    """``--since TIME`` and ``--until TIME`` in the same words wherever they are taken
    (``fairgate audit query``, ``fairgate report``): both read by
    :func:`audit.query.parse_when`, ``since`` inclusive, ``until`` exclusive."""
    hint = "RFC 3339, a date (UTC) or an age such as 7d"
    parser.add_argument("--since", metavar="TIME",
                        help=f"from TIME on, inclusive: {hint} (default: {since_default})")
    parser.add_argument("--until", metavar="TIME",
                        help=f"up to TIME, exclusive: {hint} (default and at most: now)")


def _add_audit(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = _subparser(
        subparsers, "audit", "read and verify the audit log",
        "Every admission, queue, deny, dispatch, release and quota change is one record in\n"
        "the hash-chained Redis Stream fairgate:audit (and a JSON line on the writer's\n"
        "stdout).",
        "  export REDIS_URL=redis://127.0.0.1:6379/0\n"
        "  fairgate audit tail\n  fairgate audit query --tenant team-a --decision deny\n"
        "  fairgate audit verify\n",
    )
    audit_sub = audit.add_subparsers(dest="audit_command", required=True, metavar="COMMAND")
    tail = _subparser(
        audit_sub, "tail", "print the newest records, then follow new ones",
        "Print the last --last records as JSON lines, then new records as they arrive\n"
        "(Ctrl-C to stop) unless --no-follow.",
        "  export REDIS_URL=redis://127.0.0.1:6379/0\n"
        "  fairgate audit tail\n  fairgate audit tail --last 100 --no-follow | jq .reason\n",
    )
    tail.add_argument("--last", type=int, default=10, metavar="N",
                      help="records of the backlog to print first (default: %(default)s)")
    tail.add_argument("--follow", action=argparse.BooleanOptionalAction, default=True,
                      help="keep printing new records (default: on)")
    _redis_url_argument(tail)
    tail.set_defaults(handler=_audit_tail)
    query = _subparser(
        audit_sub, "query", "print the records matching filters",
        "Print records matching every filter given, oldest first, as a table or JSON lines.\n"
        f"{TIME_FORMATS}",
        "  export REDIS_URL=redis://127.0.0.1:6379/0\n"
        "  fairgate audit query --tenant team-a --decision deny --since 2h\n"
        "  fairgate audit query --user alice@example.com --json\n",
    )
    query.add_argument("--tenant", help="only this tenant")
    query.add_argument("--decision", choices=DECISIONS, metavar="DECISION",
                       help="only this decision: " + ", ".join(DECISIONS))
    query.add_argument("--user", help="only requests by this user")
    _time_arguments(query, since_default="the oldest record kept")
    query.add_argument("--json", action="store_true", help="print JSON lines, not a table")
    _redis_url_argument(query)
    query.set_defaults(handler=_audit_query)
    verify = _subparser(
        audit_sub, "verify", "check the hash chain; name the first broken record",
        "Verify every record's hash and link. Exit 0 when intact; 1 naming the first\n"
        "edited, removed or reordered record. --json prints one object: stream, ok,\n"
        "checked, first_seq, last_seq, first_bad, stream_id (of the first broken\n"
        "record) and problem.",
        "  export REDIS_URL=redis://127.0.0.1:6379/0\n  fairgate audit verify\n"
        "  fairgate audit verify --json | jq .ok\n",
    )
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    _redis_url_argument(verify)
    verify.set_defaults(handler=_audit_verify)


# -- dispatch --------------------------------------------------------------------------


def _dispatch(args: argparse.Namespace) -> int:
    from webhook.dispatch import DispatchError, run_dispatch
    from webhook.logs import configure_logging

    configure_logging(args.log_level)
    try:
        return run_dispatch(args.redis, Path(args.config_dir) if args.config_dir else None,
                            args.metrics_port, not_ready_grace=args.not_ready_grace,
                            unschedulable_grace=args.unschedulable_grace,
                            budget_every=args.budget_every,
                            audit_retention=args.audit_retention)
    except DispatchError as exc:
        print(f"fairgate: error: {exc}", file=sys.stderr)
        return 2


def _add_dispatch(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dispatch = _subparser(
        subparsers, "dispatch", "run the dispatcher and reconciler",
        "Release gated pods from the weighted-fair queue by lifting their\n"
        "fairgate.io/queue gate, in this order: inference before training; then the\n"
        "tenant with the lowest virtual time (the GPU service it received while it had\n"
        "pods running or waiting, per unit of weight; a tenant back from idle starts at\n"
        "the active tenants' lowest, so idle time earns no credit); ties to the tenant\n"
        "whose waiting pod was created first, then first in, first out. A gang is\n"
        "released whole or not at all. See docs/fairness.md. It also frees usage when\n"
        "pods end, expires unconfirmed reservations, posts Events, and rebuilds the\n"
        "queue from the cluster at start and on a timer. Talks to the cluster with\n"
        "in-cluster credentials or $KUBECONFIG. Several replicas may run at once.\n"
        "SIGTERM stops it.",
        "  fairgate dispatch --redis-url redis://fairgate-redis:6379/0\n"
        "  KUBECONFIG=~/.kube/config fairgate dispatch --config-dir examples/config "
        "--metrics-port 9090\n",
    )
    _redis_url_argument(dispatch)
    dispatch.add_argument("--config-dir", metavar="DIR",
                          help="local config directory (default: the cluster's ConfigMaps)")
    dispatch.add_argument("--metrics-port", type=_port, metavar="N",
                          help="serve Prometheus metrics over HTTP on this port (default: off)")
    dispatch.add_argument("--not-ready-grace", type=_positive_seconds, metavar="SECONDS",
                          default=DEFAULT_NOT_READY_GRACE,
                          help="a node not Ready for longer than this is not capacity; a "
                               "shorter blip keeps it (default: %(default)gs)")
    dispatch.add_argument("--unschedulable-grace", type=_positive_seconds, metavar="SECONDS",
                          default=DEFAULT_UNSCHEDULABLE_GRACE,
                          help="a released pod the scheduler reports Unschedulable for "
                               "longer than this is caught: a Warning Event, the metric "
                               "fairgate_unschedulable_releases_total, and its demand "
                               "withheld from capacity until it is bound or gone; it stays "
                               "counted against quota (default: %(default)gs)")
    dispatch.add_argument("--budget-every", type=_positive_seconds, metavar="SECONDS",
                          default=DEFAULT_BUDGET_EVERY,
                          help="how often tenants' month-to-date spend is billed from the "
                               "audit log for their budgets (also at once on a config "
                               "change; default: %(default)gs)")
    _audit_retention_argument(dispatch)
    dispatch.add_argument("--log-level", default="info",
                          choices=["debug", "info", "warning", "error"],
                          help="log level (default: %(default)s)")
    dispatch.set_defaults(handler=_dispatch)


# -- report --------------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    from cost.report import Format, report_command
    from tenants.localdir import load_config_dir

    pricing = load_config_dir(Path(args.config_dir)).platform.pricing \
        if args.config_dir else None
    output: Format = "json" if args.json else "csv" if args.csv else "table"
    return report_command(_redis_client(args), sys.stdout, since=args.since,
                          until=args.until, output=output,
                          share_idle=args.share_idle == "proportional", pricing=pricing)


def _add_report(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = _subparser(
        subparsers, "report", "chargeback: GPU hours and cost per tenant from the audit log",
        "Verify the audit log's hash chain (refuse, exit 1, when it does not verify), then\n"
        "bill the window per tenant and class: gpu_hours (GPU-equivalent hours: slices/7),\n"
        "borrowed_gpu_hours, cost, preempted_pods and preempted_gpu_hours (GPU-time the\n"
        "preempted pods had run: lost work), reclaimed_pods and reclaimed_gpu_hours (the\n"
        "same for pods fairgate reclaimed, fairShare.reclaim), a totals row, and the\n"
        "cluster's idle GPU hours (capacity not used). A pod's GPU-time runs from when\n"
        "the dispatcher saw it Running to its release; pods crossing the window's edges\n"
        "are clipped exactly.\n"
        "Prices come from the log (the dispatcher records platform.yaml's pricing when it\n"
        "starts and whenever it changes; edits of fairgate-platform are audited), each\n"
        "from its time on, never retroactively; a MIG slice costs slices/7 of its GPU.\n"
        f"{TIME_FORMATS}\nDefault window: this calendar month (UTC) until now. JSON carries\n"
        "OpenCost's names too (per row: opencost.gpuHours, opencost.gpuCost).",
        "  export REDIS_URL=redis://127.0.0.1:6379/0\n"
        "  fairgate report\n"
        "  fairgate report --since 2026-03-01 --until 2026-04-01 --csv > march.csv\n"
        "  fairgate report --since 7d --json | jq '.rows[] | {tenant, cost}'\n"
        "  fairgate report --share-idle proportional\n",
    )
    _redis_url_argument(report)
    _time_arguments(report, since_default="the 1st of this month, UTC")
    formats = report.add_mutually_exclusive_group()
    formats.add_argument("--json", action="store_true", help="print one JSON object")
    formats.add_argument("--csv", action="store_true",
                         help="print CSV: a row per tenant and class, total, (idle)")
    report.add_argument("--share-idle", choices=["proportional"],
                        help="share the idle capacity's hours and cost among tenants in "
                             "proportion to their GPU hours (OpenCost's shareIdle)")
    report.add_argument("--config-dir", metavar="DIR",
                        help="local config directory whose platform.yaml pricing applies "
                             "where the log records no prices (default: prices from the "
                             "log only)")
    report.set_defaults(handler=_report)


# -- status, why, simulate ---------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from fairshare.status import status_command

    return status_command(args.redis, args.json)


def _add_status(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = _subparser(
        subparsers, "status", "per-tenant usage against fair share, quota and queues",
        "Per tenant: weight, nominal, borrowLimit, used, its entitlement (fair share:\n"
        "each placement class's capacity split by weight among tenants with demand in\n"
        "it, each capped at used + queued there, summed over classes and capped at\n"
        "nominal + borrowLimit) and used / entitlement, borrowed, queued by\n"
        "class and weighted share (usage / weight); Jain's index of used / entitlement\n"
        "over the tenants entitled to something (n/a with fewer than two, or no usage).\n"
        "Then the capacity held for the pods owed it that do not fit yet (in fair-share\n"
        "order, each below its weighted share), and for whom, e.g.\n"
        "\"team-b: 2 of 4 gpu held for team-b-dev/big (training)\"\n"
        "(JSON: held). Then the capacity as the dispatcher last read it from the nodes:\n"
        "the nodes left out and why (cordoned, NotReady longer than --not-ready-grace,\n"
        "a NoSchedule or NoExecute taint fairgate's pods do not tolerate) and GPUs held\n"
        "by pods fairgate\n"
        "does not manage (subtracted), e.g. \"node gpu-3 cordoned (gpu=4 not counted)\",\n"
        "and the capacity withheld for released pods the scheduler reports Unschedulable\n"
        "past --unschedulable-grace (JSON: capacity_notes.withheld, .unschedulable).\n"
        "From the queue in Redis.",
        "  fairgate status --redis-url redis://127.0.0.1:6379/0\n"
        "  REDIS_URL=redis://127.0.0.1:6379/0 fairgate status --json | jq '.tenants'\n",
    )
    _redis_url_argument(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(handler=_status)


def _why(args: argparse.Namespace) -> int:
    from fairshare.status import why_command

    return why_command(args.redis, args.pod, args.json)


def _add_why(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    why = _subparser(
        subparsers, "why", "explain what happened to a pod",
        "Say in plain words whether a pod is not fairgate's business, was denied (and\n"
        "why), is queued (position, and what it waits for: tenant quota, inference\n"
        "reserve, cluster capacity, gang members) or was released (when, after how long).\n"
        "Exit status: 0; 1 when fairgate has no record of the pod (not a GPU pod, never\n"
        "created, a mistyped name, or older than the audit retention) or Redis fails.",
        "  export REDIS_URL=redis://127.0.0.1:6379/0\n"
        "  fairgate why team-a-dev/trainer-0\n  fairgate why team-a-dev/trainer-0 --json\n",
    )
    why.add_argument("pod", metavar="NAMESPACE/POD", help="the pod, e.g. team-a-dev/trainer-0")
    why.add_argument("--json", action="store_true", help="print JSON instead of text")
    _redis_url_argument(why)
    why.set_defaults(handler=_why)


def _simulate(args: argparse.Namespace) -> int:
    from fairshare.sim.simulate import Window, simulate_command

    return simulate_command(
        Path(args.trace), args.json, args.redis,
        timeline=Path(args.timeline) if args.timeline else None,
        timeline_every=args.timeline_every,
        plot_path=Path(args.plot) if args.plot else None,
        window=None if args.window is None else Window(*args.window),
    )


def _add_simulate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    simulate = _subparser(
        subparsers, "simulate", "replay a workload trace through the real queue",
        "Run the real queue (Lua in Redis) and dispatcher on a virtual clock against a\n"
        "trace (capacity, tenants with weights and quotas, pod arrivals) and report\n"
        "each tenant's share / weight, Jain's index of GPU-time / entitlement (as in\n"
        "status; n/a when not defined), wait percentiles per class and\n"
        "utilisation. Starts its own redis-server unless --redis-url / $REDIS_URL is\n"
        "given. Trace format: docs/reference.md ('Simulation trace') and examples/.\n"
        "--timeline writes each tenant's allocation and entitlement (its fair share:\n"
        "the capacity split by weight among tenants with pods running or waiting) every\n"
        "N virtual seconds as CSV, with the allocation also split by class (inference,\n"
        "training); --plot draws them (needs pip install 'fairgate[plot]').\n"
        "The window measures judge fairness over time: per tenant, the GPU-seconds it\n"
        "held (by class) against its entitlement integrated over the window (what it\n"
        "would have had following its fair share at every instant; idle time earns\n"
        "nothing), and the seconds it had a pod waiting (the whole window when it was\n"
        "backlogged throughout), plus Jain's index of GPU-seconds / entitlement and\n"
        "utilisation while pods wait. --window FROM:TO (seconds of trace time; FROM: or\n"
        ":TO for an open end) sets the window, default the whole run; pick the span in\n"
        "which every tenant has work, e.g. from the last tenant's first pod to the end.\n"
        "JSON: window.tenants.<name>.gpu_seconds, .entitled_gpu_seconds,\n"
        ".of_entitlement, .gpu_seconds_by_class, .backlogged_seconds; and waited.inference:\n"
        "how many inference pods did not start the instant they were created.\n"
        "With gangs, a table says whether each ran, when, and whole: arrival, release,\n"
        "wait, run time and outcome (ran whole, still waiting at the end, preempted, ...);\n"
        "the ten longest waits there, every gang in JSON: gangs.",
        "  fairgate simulate examples/weights-1-2-3.yaml\n"
        "  fairgate simulate examples/gangs.yaml --json \\\n"
        "    | jq '[.gangs[] | select(.outcome == \"waiting_at_end\") | .group]'\n"
        "  fairgate simulate examples/weights-1-2-3.yaml --timeline out.csv --timeline-every 30 "
        "--plot out.png\n"
        "  fairgate simulate examples/contention/5-staggered-join.yaml --window 3600: --json \\\n"
        "    | jq '.window.tenants | map_values(.of_entitlement)'\n",
    )
    simulate.add_argument("trace", metavar="TRACE.yaml", help="the trace file")
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.add_argument("--timeline", metavar="OUT.csv",
                          help="write time,tenant,allocated_gpu_eq,entitlement_gpu_eq,"
                          "inference_gpu_eq,training_gpu_eq rows")
    simulate.add_argument("--timeline-every", type=_positive_seconds, metavar="N",
                          help="seconds of virtual time between timeline rows "
                          "(default: 60; needs --timeline or --plot)")
    simulate.add_argument("--plot", metavar="OUT.png",
                          help="draw allocation (solid) and entitlement (dashed) per tenant "
                          "over time (needs matplotlib: pip install 'fairgate[plot]')")
    simulate.add_argument("--window", type=_window, metavar="FROM:TO",
                          help="seconds of trace time the window measures cover "
                          "(default: 0 to the horizon; FROM: runs to the horizon)")
    _redis_url_argument(simulate, required=False)
    simulate.set_defaults(handler=_simulate)


# -- console -----------------------------------------------------------------------------


def _console(args: argparse.Namespace) -> int:
    from webhook.console.run import ConsoleError, ConsoleOptions, run_console

    options = ConsoleOptions(
        redis=args.redis, config_dir=Path(args.config_dir) if args.config_dir else None,
        host=args.host, port=args.port, auth=args.auth,
        sample_interval=args.sample_every, keep_hours=args.keep_hours,
        cert_dir=Path(args.cert_dir) if args.cert_dir else None, plain_http=args.plain_http,
        insecure_cookie=args.insecure_cookie, forwarded_allow_ips=args.forwarded_allow_ips,
        connections=_connection_limits(args),
    )
    try:
        return run_console(options)
    except ConsoleError as exc:
        print(f"fairgate: error: {exc}", file=sys.stderr)
        return 2


def _hours_kept(text: str) -> float:
    value = _positive_seconds(text)
    if value > 24 * 30:
        raise argparse.ArgumentTypeError(f"{text!r} hours: keep at most 720 (30 days)")
    return value


def _add_console(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    console = _subparser(
        subparsers, "console", "web console: tenants, queue, fairness, audit, cost",
        "Serve a live web view of the queue in Redis: per tenant weight, quota, usage\n"
        "(nominal and borrowed), queued pods and share against entitlement; each waiting\n"
        "pod with its position and why it waits; fairness over the last hours; the audit\n"
        "log with the chain's verification status. JSON for every page under /api/, live\n"
        "updates at /api/events (Server-Sent Events). See docs/console.md.\n"
        "The first line on stdout is `console: <url to open>`. Locally (--auth token,\n"
        "the default outside a cluster) it binds 127.0.0.1 and the URL carries a random\n"
        "access token. In a cluster (--auth kubernetes, the default there) every request\n"
        "needs the user's bearer token: checked with TokenReview, and each user sees the\n"
        "tenants whose quota ConfigMap they may read (SubjectAccessReview); users who may\n"
        "read every ConfigMap in fairgate-system see everything.\n"
        "With --cert-dir it serves HTTPS; plain HTTP only on a loopback address (or with\n"
        "--plain-http behind a TLS-terminating proxy).",
        "  fairgate console --redis-url redis://127.0.0.1:6379/0\n"
        "  REDIS_URL=redis://127.0.0.1:6379/0 fairgate console --config-dir examples/config "
        "--port 9000\n"
        "  fairgate console --auth kubernetes --host 0.0.0.0 --cert-dir /tls  # in a cluster\n",
    )
    _redis_url_argument(console)
    console.add_argument("--config-dir", metavar="DIR",
                         help="local config directory, for ceilings and namespace filters "
                         "(default: the cluster's config with --auth kubernetes, else none)")
    console.add_argument("--host", default="127.0.0.1",
                         help="address to listen on (default: %(default)s)")
    console.add_argument("--port", type=_port_or_zero, default=8080,
                         help="HTTP(S) port; 0 picks a free one (default: %(default)s)")
    console.add_argument("--cert-dir", metavar="DIR",
                         help="serve HTTPS with DIR's tls.crt and tls.key (see `fairgate "
                         "certs generate --service fairgate-console`); a renewed pair is "
                         "taken up without a restart")
    console.add_argument("--plain-http", action="store_true",
                         help="allow plain HTTP on a non-loopback --host: only behind a "
                         "TLS-terminating proxy (tokens must not cross a network in clear)")
    console.add_argument("--forwarded-allow-ips", metavar="IPS",
                         help="comma-separated addresses (or *) of the proxies whose "
                         "X-Forwarded-Proto and X-Forwarded-For are trusted (default: "
                         "$FORWARDED_ALLOW_IPS, else 127.0.0.1)")
    console.add_argument("--insecure-cookie", action="store_true",
                         help="send the access-token cookie without Secure: only when "
                         "browsers reach the console over plain http other than "
                         "localhost/127.0.0.1 on purpose (default: always Secure)")
    console.add_argument("--auth", choices=["auto", "token", "kubernetes"], default="auto",
                         help="token: a random access token in the URL; kubernetes: "
                         "TokenReview + SubjectAccessReview; auto: kubernetes inside a "
                         "cluster, else token (default: %(default)s)")
    console.add_argument("--sample-every", type=_positive_seconds, default=60.0,
                         metavar="SECONDS",
                         help="seconds between fairness samples (default: %(default)g)")
    console.add_argument("--keep-hours", type=_hours_kept, default=6.0, metavar="HOURS",
                         help="hours of fairness history kept in Redis (default: %(default)g)")
    _connection_arguments(console, CONSOLE_LIMITS)
    console.set_defaults(handler=_console)


# -- config ----------------------------------------------------------------------------


def _config_check(args: argparse.Namespace) -> int:
    from webhook.configcheck import check_config_dir

    return check_config_dir(Path(args.dir), sys.stdout)


def _add_config(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    config = _subparser(
        subparsers, "config", "check a tenant config directory before fairgate reads it",
        "Work with a --config-dir (platform.yaml, quota-<tenant>.yaml, namespaces.yaml).",
        "  fairgate config check examples/config\n",
    )
    config_sub = config.add_subparsers(dest="config_command", required=True,
                                       metavar="COMMAND")
    check = _subparser(
        config_sub, "check", "validate a config directory as `fairgate serve` would",
        "Read every file of DIR with the same code `fairgate serve --config-dir` uses and\n"
        "say, file by file, what is valid and what is wrong: the field, the line when it is\n"
        "known, and how to fix it. Quotas are checked against platform.yaml's tenants and\n"
        "ceilings, namespaces against its tenants. Needs no Redis and no cluster.\n"
        "Exit status: 0 when every file is valid, 1 when any is not (serve would refuse to\n"
        "start on it; a running serve keeps the last good version of each broken file and\n"
        "goes on using the others' edits).\n\n"
        "For example, after cp -r examples/config my-config and raising team-b's quota\n"
        "past its ceiling (echo 'nominal: {gpu: 6}' > my-config/quota-team-b.yaml):\n"
        "  $ fairgate config check my-config\n"
        "  Checking my-config as `fairgate serve --config-dir` reads it:\n"
        "    ok    platform.yaml: 2 tenants: team-a, team-b\n"
        "    ok    quota-team-a.yaml: tenant team-a, nominal 4.00 GPU-eq, borrowLimit\n"
        "          2.00 GPU-eq\n"
        "    error quota-team-b.yaml:\n"
        "            nominal: 6.00 GPU-eq exceeds the ceiling of 4 GPU-eq set by the\n"
        "            platform team for 'team-b': lower nominal or ask them to raise the\n"
        "            ceiling\n"
        "    ok    namespaces.yaml: 3 namespaces mapped\n"
        "  1 file has errors: fix them and run this again. `fairgate serve` would not\n"
        "  start on this directory; a running one keeps the last good version of each\n"
        "  broken file.\n"
        "  $ echo $?\n"
        "  1\n",
        "  fairgate config check examples/config\n"
        "  # publish only valid files:\n"
        "  mkdir -p live && fairgate config check examples/config && cp examples/config/* live/\n",
    )
    check.add_argument("dir", metavar="DIR",
                       help="the config directory, as given to --config-dir")
    check.set_defaults(handler=_config_check)


def _port_or_zero(text: str) -> int:
    return 0 if text == "0" else _port(text)



def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fairgate``."""
    parser = argparse.ArgumentParser(
        prog="fairgate",
        description="Fair GPU and MIG sharing for multi-tenant Kubernetes: admission webhook,\n"
        "weighted-fair dispatcher, audit log.",
        epilog=_EPILOG_MAIN,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version",
                        version=f"fairgate {importlib.metadata.version('fairgate')}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo(subparsers)
    _add_certs(subparsers)
    _add_redis_secret(subparsers)
    _add_serve(subparsers)
    _add_dispatch(subparsers)
    _add_audit(subparsers)
    _add_status(subparsers)
    _add_why(subparsers)
    _add_simulate(subparsers)
    _add_report(subparsers)
    _add_console(subparsers)
    _add_config(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fairgate`` with ``argv`` (default: the process arguments)."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        _resolve_redis(args)
    except RedisSettingsError as exc:
        print(f"fairgate: error: {exc}", file=sys.stderr)
        return 2
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except (ConfigError, CertError) as exc:
        print(f"fairgate: error: {exc}", file=sys.stderr)
        return 2
    except redis.RedisError as exc:
        target: RedisTarget | None = getattr(args, "redis", None)
        problem = target.problem(exc) if target is not None else f"cannot reach Redis ({exc})"
        print(f"fairgate: error: {problem}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"fairgate: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

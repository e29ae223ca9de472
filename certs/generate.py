"""CA and serving-certificate issuance, renewal policy, and the on-disk bundle.

A *bundle* is four PEM blobs, stored as files of these names in a cert dir and as keys of
the same names in the cluster Secret:

- ``ca.crt``: the trust bundle. Its first certificate is the issuing CA (whose key is
  ``ca.key``); after a CA rotation it is followed by the previous CA for as long as that
  one is still valid, so clients holding either CA keep trusting the server. This is
  what goes into a webhook configuration's ``caBundle``.
- ``ca.key``: the issuing CA's private key (PKCS#8, mode 0600). It is kept only so that
  the serving certificate can be renewed with the same CA; it must never be mounted
  into anything but fairgate's cert bootstrap.
- ``tls.crt``: the serving certificate (leaf only).
- ``tls.key``: its private key (PKCS#8, mode 0600).

Keys are ECDSA P-256, signatures ECDSA-SHA256. The CA is valid for 10 years and the
serving certificate for 1 year by default; both start 5 minutes in the past to absorb
clock skew. A certificate is due for renewal once two-thirds of its lifetime has passed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SERVICE = "fairgate-webhook"
DEFAULT_NAMESPACE = "fairgate-system"
CA_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=365)
CLOCK_SKEW = dt.timedelta(minutes=5)

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
BUNDLE_FILES = (CA_CERT_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SERVICE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


class CertError(ValueError):
    """Certificate material or a certificate request is invalid; the message says why."""


@dataclass(frozen=True)
class CertPaths:
    """Where a bundle was written."""

    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class Bundle:
    """A CA trust bundle, the CA key, and a serving certificate with its key (all PEM)."""

    ca_cert_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_certs(self) -> list[x509.Certificate]:
        """The trust bundle, issuing CA first."""
        return x509.load_pem_x509_certificates(self.ca_cert_pem)

    @property
    def ca_cert(self) -> x509.Certificate:
        """The issuing CA."""
        return self.ca_certs[0]

    @property
    def cert(self) -> x509.Certificate:
        """The serving certificate."""
        return x509.load_pem_x509_certificate(self.cert_pem)

    def as_files(self) -> dict[str, bytes]:
        """File name (also the Secret key) to content."""
        return {
            CA_CERT_FILE: self.ca_cert_pem,
            CA_KEY_FILE: self.ca_key_pem,
            CERT_FILE: self.cert_pem,
            KEY_FILE: self.key_pem,
        }

    @classmethod
    def from_files(cls, files: dict[str, bytes], *, source: str) -> Bundle:
        """Build and check a bundle from file-name keyed content.

        Raises CertError naming ``source`` when a file is missing, unparsable, a key does
        not match its certificate, or the serving certificate is not issued by the CA.
        """
        missing = [name for name in BUNDLE_FILES if not files.get(name)]
        if missing:
            raise CertError(
                f"{source}: missing {', '.join(missing)}; "
                "regenerate it with `fairgate certs generate --out DIR`"
            )
        bundle = cls(
            ca_cert_pem=files[CA_CERT_FILE],
            ca_key_pem=files[CA_KEY_FILE],
            cert_pem=files[CERT_FILE],
            key_pem=files[KEY_FILE],
        )
        bundle.check(source=source)
        return bundle

    def check(self, *, source: str) -> None:
        """Raise CertError unless the keys match and the serving cert chains to the CA."""
        try:
            ca_cert, cert = self.ca_cert, self.cert
        except ValueError as exc:
            raise CertError(f"{source}: unreadable certificate PEM ({exc})") from exc
        require_key_matches(ca_cert, self.ca_key_pem, what=f"{source}: {CA_KEY_FILE}")
        require_key_matches(cert, self.key_pem, what=f"{source}: {KEY_FILE}")
        try:
            cert.verify_directly_issued_by(ca_cert)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise CertError(
                f"{source}: {CERT_FILE} is not issued by the first certificate in "
                f"{CA_CERT_FILE} ({exc}); regenerate the bundle"
            ) from exc


def _load_private_key(pem: bytes, *, what: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"{what}: not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{what}: expected an ECDSA key, got {type(key).__name__}")
    return key


def require_key_matches(cert: x509.Certificate, key_pem: bytes, *, what: str) -> None:
    """Raise CertError (prefixed with ``what``) unless ``key_pem`` is ``cert``'s key."""
    key = _load_private_key(key_pem, what=what)
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    if key.public_key().public_bytes(enc, fmt) != cert.public_key().public_bytes(enc, fmt):
        raise CertError(f"{what}: private key does not match its certificate")


def _parse_extra_san(value: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    name = value.lower().rstrip(".")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_DNS_LABEL.fullmatch(lb) for lb in labels):
        raise CertError(
            f"extra SAN {value!r} is neither an IP address nor a DNS name "
            "(lowercase letters, digits, '-' and '.', labels of 1-63 characters)"
        )
    return x509.DNSName(name)


def serving_names(
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_sans: Sequence[str] = (),
) -> list[x509.GeneralName]:
    """The SANs of the serving cert: the Service's four DNS forms, then ``extra_sans``.

    Raises CertError when the service or namespace is not a valid Kubernetes name or an
    extra SAN is neither an IP address nor a DNS name.
    """
    if not _SERVICE_NAME.fullmatch(service):
        raise CertError(
            f"service name {service!r} is not a valid Kubernetes Service name "
            "(lowercase letters, digits and '-', starting with a letter, at most 63)"
        )
    if not _DNS_LABEL.fullmatch(namespace):
        raise CertError(
            f"namespace {namespace!r} is not a valid Kubernetes namespace "
            "(lowercase letters, digits and '-', at most 63)"
        )
    base = [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in base]
    names.append(x509.DNSName(f"{service}.{namespace}.svc.cluster.local"))
    for extra in extra_sans:
        parsed = _parse_extra_san(extra)
        if parsed not in names:
            names.append(parsed)
    return names


def _utcnow(now: dt.datetime | None) -> dt.datetime:
    if now is None:
        return dt.datetime.now(dt.UTC)
    if now.tzinfo is None:
        raise CertError("`now` must be timezone-aware (e.g. datetime.now(timezone.utc))")
    return now


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _new_ca(now: dt.datetime, validity: dt.timedelta) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fairgate"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"fairgate-webhook-ca-{now:%Y%m%d%H%M%S}"),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def _issue_serving(
    ca_cert: x509.Certificate,
    ca_key_pem: bytes,
    names: list[x509.GeneralName],
    now: dt.datetime,
    validity: dt.timedelta,
) -> tuple[bytes, bytes]:
    """Issue a serving cert for ``names`` (from ``serving_names``: its third is the CN)."""
    ca_key = _load_private_key(ca_key_pem, what=CA_KEY_FILE)
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    if not_after <= now:
        raise CertError("the CA has expired; generate a new bundle")
    cn = names[2].value  # <svc>.<ns>.svc
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(cn))]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def new_bundle(
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_sans: Sequence[str] = (),
    *,
    ca_validity: dt.timedelta = CA_VALIDITY,
    serving_validity: dt.timedelta = SERVING_VALIDITY,
    now: dt.datetime | None = None,
) -> Bundle:
    """A fresh CA and a serving certificate for the Service (see ``serving_names``)."""
    at = _utcnow(now)
    names = serving_names(service, namespace, extra_sans)
    ca_cert_pem, ca_key_pem = _new_ca(at, ca_validity)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    cert_pem, key_pem = _issue_serving(ca_cert, ca_key_pem, names, at, serving_validity)
    return Bundle(ca_cert_pem, ca_key_pem, cert_pem, key_pem)


def needs_renewal(cert: x509.Certificate, now: dt.datetime) -> bool:
    """True once two-thirds of the certificate's lifetime has passed (or it has expired)."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return _utcnow(now) >= start + (end - start) * 2 / 3


def renew_serving_cert(
    bundle: Bundle,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_sans: Sequence[str] = (),
    *,
    validity: dt.timedelta = SERVING_VALIDITY,
    now: dt.datetime | None = None,
) -> Bundle:
    """The bundle with a new serving key and certificate issued by the same CA.

    The new certificate never outlives the CA.
    """
    at = _utcnow(now)
    names = serving_names(service, namespace, extra_sans)
    cert_pem, key_pem = _issue_serving(bundle.ca_cert, bundle.ca_key_pem, names, at, validity)
    return Bundle(bundle.ca_cert_pem, bundle.ca_key_pem, cert_pem, key_pem)


def refresh_bundle(
    bundle: Bundle | None,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_sans: Sequence[str] = (),
    *,
    ca_validity: dt.timedelta = CA_VALIDITY,
    serving_validity: dt.timedelta = SERVING_VALIDITY,
    now: dt.datetime | None = None,
) -> Bundle:
    """The bundle to use from now on; ``bundle`` itself (same object) when nothing is due.

    - no bundle: a new one;
    - CA due for renewal: a new CA and serving cert; the old CA stays in ``ca.crt``
      behind the new one while it is still valid, so either CA is trusted meanwhile;
    - serving cert due for renewal, or its SANs differ from the requested ones: a new
      serving cert from the same CA;
    - previous CAs that have expired are dropped from ``ca.crt``.
    """
    at = _utcnow(now)
    if bundle is None:
        return new_bundle(
            service,
            namespace,
            extra_sans,
            ca_validity=ca_validity,
            serving_validity=serving_validity,
            now=at,
        )
    if needs_renewal(bundle.ca_cert, at):
        fresh = new_bundle(
            service,
            namespace,
            extra_sans,
            ca_validity=ca_validity,
            serving_validity=serving_validity,
            now=at,
        )
        still_valid = [c for c in bundle.ca_certs if c.not_valid_after_utc > at]
        trust = fresh.ca_cert_pem + b"".join(_cert_pem(c) for c in still_valid)
        return Bundle(trust, fresh.ca_key_pem, fresh.cert_pem, fresh.key_pem)
    issuing, *previous = bundle.ca_certs
    still_valid = [c for c in previous if c.not_valid_after_utc > at]
    refreshed = bundle
    if len(still_valid) < len(previous):
        trust = b"".join(_cert_pem(c) for c in [issuing, *still_valid])
        refreshed = replace(bundle, ca_cert_pem=trust)
    wanted = serving_names(service, namespace, extra_sans)
    san = bundle.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    if needs_renewal(bundle.cert, at) or list(san) != wanted:
        return renew_serving_cert(
            refreshed, service, namespace, extra_sans, validity=serving_validity, now=at
        )
    return refreshed


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_bundle(bundle: Bundle, out_dir: Path) -> CertPaths:
    """Write the bundle's four files into ``out_dir`` (created if absent).

    Each file is replaced atomically; keys get mode 0600, certificates 0644. The trust
    bundle is written first and the serving key before its certificate, so a reader
    polling the directory sees at worst a key that does not match the certificate yet
    (``CertReloader`` waits for a matching pair).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(
        ca_cert=out_dir / CA_CERT_FILE,
        ca_key=out_dir / CA_KEY_FILE,
        cert=out_dir / CERT_FILE,
        key=out_dir / KEY_FILE,
    )
    _atomic_write(paths.ca_cert, bundle.ca_cert_pem, 0o644)
    _atomic_write(paths.ca_key, bundle.ca_key_pem, 0o600)
    _atomic_write(paths.key, bundle.key_pem, 0o600)
    _atomic_write(paths.cert, bundle.cert_pem, 0o644)
    return paths


def load_bundle(cert_dir: Path) -> Bundle:
    """Read and check the four bundle files in ``cert_dir`` (CertError if incomplete/bad)."""
    files = {n: (cert_dir / n).read_bytes() for n in BUNDLE_FILES if (cert_dir / n).is_file()}
    return Bundle.from_files(files, source=str(cert_dir))


def write_bundle(
    out_dir: Path,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_sans: Sequence[str] = (),
) -> CertPaths:
    """Generate a new CA and serving certificate and write them into ``out_dir``.

    Writes ``ca.crt``, ``ca.key`` (0600), ``tls.crt`` and ``tls.key`` (0600); existing
    files are replaced.
    """
    return save_bundle(new_bundle(service, namespace, extra_sans), out_dir)

"""Certificate contents, chain verification, renewal policy and the on-disk bundle."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from hypothesis import given, settings
from hypothesis import strategies as st

from certs import (
    Bundle,
    CertError,
    load_bundle,
    needs_renewal,
    new_bundle,
    refresh_bundle,
    renew_serving_cert,
    save_bundle,
    write_bundle,
)

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
SERVICE_NAMES = [
    "fairgate-webhook",
    "fairgate-webhook.fairgate-system",
    "fairgate-webhook.fairgate-system.svc",
    "fairgate-webhook.fairgate-system.svc.cluster.local",
]


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return new_bundle(extra_sans=["127.0.0.1", "localhost", "::1"], now=NOW)


def verify(bundle: Bundle, name: x509.DNSName | x509.IPAddress, at: dt.datetime = NOW) -> None:
    """Full RFC 5280 server verification of the serving cert for ``name``."""
    store = Store(bundle.ca_certs)
    verifier = PolicyBuilder().store(store).time(at).build_server_verifier(name)
    verifier.verify(bundle.cert, [])


def sans(cert: x509.Certificate) -> list[x509.GeneralName]:
    return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)


def test_serving_cert_names_the_service_in_all_four_forms_then_the_extras(bundle: Bundle) -> None:
    assert sans(bundle.cert) == [
        *(x509.DNSName(n) for n in SERVICE_NAMES),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]


def test_custom_service_and_namespace_and_duplicate_extras_collapse() -> None:
    b = new_bundle("hook", "team-x", ["hook.team-x.svc", "HOOK.example.com."], now=NOW)
    assert sans(b.cert) == [
        x509.DNSName("hook"),
        x509.DNSName("hook.team-x"),
        x509.DNSName("hook.team-x.svc"),
        x509.DNSName("hook.team-x.svc.cluster.local"),
        x509.DNSName("hook.example.com"),
    ]


@pytest.mark.parametrize(
    "name",
    [
        x509.DNSName("fairgate-webhook.fairgate-system.svc"),
        x509.DNSName("fairgate-webhook.fairgate-system.svc.cluster.local"),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ],
)
def test_chain_verifies_for_every_served_name(
    bundle: Bundle, name: x509.DNSName | x509.IPAddress
) -> None:
    verify(bundle, name)
    bundle.cert.verify_directly_issued_by(bundle.ca_cert)


def test_chain_does_not_verify_for_other_names_or_after_expiry(bundle: Bundle) -> None:
    with pytest.raises(VerificationError):
        verify(bundle, x509.DNSName("other.fairgate-system.svc"))
    with pytest.raises(VerificationError):
        verify(bundle, x509.IPAddress(ipaddress.ip_address("10.0.0.1")))
    with pytest.raises(VerificationError):
        verify(bundle, x509.DNSName("localhost"), NOW + dt.timedelta(days=366))


def test_serving_cert_does_not_verify_against_another_ca(bundle: Bundle) -> None:
    other = new_bundle(now=NOW)
    mixed = Bundle(other.ca_cert_pem, other.ca_key_pem, bundle.cert_pem, bundle.key_pem)
    with pytest.raises(VerificationError):
        verify(mixed, x509.DNSName("localhost"))
    with pytest.raises(CertError, match="not issued by"):
        mixed.check(source="mixed")


def test_serving_cert_extensions(bundle: Bundle) -> None:
    ext = bundle.cert.extensions
    bc = ext.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and not bc.value.ca
    ku = ext.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.digital_signature
    assert not (ku.value.key_cert_sign or ku.value.crl_sign or ku.value.key_encipherment)
    eku = ext.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    aki = ext.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ca_ski = bundle.ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ca_ski.digest
    ski = ext.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(bundle.cert.public_key())
    assert bundle.cert.subject.rfc4514_string() == "CN=fairgate-webhook.fairgate-system.svc"


def test_ca_extensions(bundle: Bundle) -> None:
    ext = bundle.ca_cert.extensions
    bc = ext.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = ext.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.crl_sign
    assert bundle.ca_cert.subject == bundle.ca_cert.issuer


def test_keys_are_ecdsa_p256(bundle: Bundle) -> None:
    for cert in (bundle.cert, bundle.ca_cert):
        key = cert.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey)
        assert isinstance(key.curve, ec.SECP256R1)
        assert cert.signature_hash_algorithm is not None
        assert cert.signature_hash_algorithm.name == "sha256"


def test_default_lifetimes_and_clock_skew_margin(bundle: Bundle) -> None:
    skew = dt.timedelta(minutes=5)
    assert bundle.ca_cert.not_valid_before_utc == NOW - skew
    assert bundle.ca_cert.not_valid_after_utc == NOW + dt.timedelta(days=3650)
    assert bundle.cert.not_valid_before_utc == NOW - skew
    assert bundle.cert.not_valid_after_utc == NOW + dt.timedelta(days=365)


def test_lifetimes_are_configurable_and_serving_never_outlives_the_ca() -> None:
    b = new_bundle(
        ca_validity=dt.timedelta(days=30), serving_validity=dt.timedelta(days=7), now=NOW
    )
    assert b.cert.not_valid_after_utc == NOW + dt.timedelta(days=7)
    later = NOW + dt.timedelta(days=25)
    renewed = renew_serving_cert(b, validity=dt.timedelta(days=7), now=later)
    assert renewed.cert.not_valid_after_utc == b.ca_cert.not_valid_after_utc


def test_needs_renewal_at_two_thirds_of_the_lifetime(bundle: Bundle) -> None:
    cert = bundle.cert
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    two_thirds = start + (end - start) * 2 / 3
    assert not needs_renewal(cert, start)
    assert not needs_renewal(cert, two_thirds - dt.timedelta(seconds=1))
    assert needs_renewal(cert, two_thirds)
    assert needs_renewal(cert, end + dt.timedelta(days=1))


def test_naive_datetimes_are_refused(bundle: Bundle) -> None:
    with pytest.raises(CertError, match="timezone-aware"):
        needs_renewal(bundle.cert, dt.datetime(2027, 1, 1))


def test_renew_serving_cert_keeps_the_ca_and_replaces_key_and_serial(bundle: Bundle) -> None:
    later = NOW + dt.timedelta(days=300)
    renewed = renew_serving_cert(bundle, extra_sans=["localhost"], now=later)
    assert renewed.ca_cert_pem == bundle.ca_cert_pem
    assert renewed.ca_key_pem == bundle.ca_key_pem
    assert renewed.key_pem != bundle.key_pem
    assert renewed.cert.serial_number != bundle.cert.serial_number
    assert renewed.cert.not_valid_after_utc == later + dt.timedelta(days=365)
    verify(renewed, x509.DNSName("localhost"), later)
    renewed.check(source="renewed")


def test_refresh_bundle_keeps_a_bundle_that_is_not_due(bundle: Bundle) -> None:
    extras = ["127.0.0.1", "localhost", "::1"]
    assert refresh_bundle(bundle, extra_sans=extras, now=NOW + dt.timedelta(days=200)) is bundle


def test_refresh_bundle_renews_a_due_serving_cert_with_the_same_ca(bundle: Bundle) -> None:
    extras = ["127.0.0.1", "localhost", "::1"]
    later = NOW + dt.timedelta(days=250)
    fresh = refresh_bundle(bundle, extra_sans=extras, now=later)
    assert fresh.ca_cert_pem == bundle.ca_cert_pem
    assert fresh.cert.serial_number != bundle.cert.serial_number
    assert sans(fresh.cert) == sans(bundle.cert)


def test_refresh_bundle_reissues_when_the_names_change(bundle: Bundle) -> None:
    fresh = refresh_bundle(bundle, extra_sans=["localhost"], now=NOW)
    assert fresh.ca_cert_pem == bundle.ca_cert_pem
    assert x509.IPAddress(ipaddress.ip_address("127.0.0.1")) not in sans(fresh.cert)


def test_ca_rotation_keeps_the_old_ca_trusted_until_it_expires(bundle: Bundle) -> None:
    at = NOW + dt.timedelta(days=2500)  # past two-thirds of the 10-year CA
    rotated = refresh_bundle(bundle, extra_sans=["localhost"], now=at)
    assert rotated.ca_key_pem != bundle.ca_key_pem
    assert [c.serial_number for c in rotated.ca_certs] == [
        rotated.ca_cert.serial_number,
        bundle.ca_cert.serial_number,
    ]
    rotated.check(source="rotated")
    verify(rotated, x509.DNSName("localhost"), at)
    # A replica still serving a cert of the old CA is trusted through the rotated bundle.
    old_serving = renew_serving_cert(bundle, extra_sans=["localhost"], now=at)
    old_under_new_trust = Bundle(
        rotated.ca_cert_pem, rotated.ca_key_pem, old_serving.cert_pem, old_serving.key_pem
    )
    verify(old_under_new_trust, x509.DNSName("localhost"), at)
    # Once the old CA has expired, the next rotation drops it.
    much_later = bundle.ca_cert.not_valid_after_utc + dt.timedelta(days=1)
    again = refresh_bundle(rotated, extra_sans=["localhost"], now=much_later)
    assert [c.serial_number for c in again.ca_certs] == [rotated.ca_cert.serial_number]
    again.check(source="again")


def test_write_bundle_files_modes_and_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    paths = write_bundle(out, "hook", "team-x", ["127.0.0.1"])
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    for key in (paths.key, paths.ca_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    for cert in (paths.cert, paths.ca_cert):
        assert stat.S_IMODE(cert.stat().st_mode) == 0o644
    loaded = load_bundle(out)
    assert x509.DNSName("hook.team-x.svc") in sans(loaded.cert)
    loaded.cert.verify_directly_issued_by(loaded.ca_cert)


def test_save_bundle_replaces_existing_files(tmp_path: Path, bundle: Bundle) -> None:
    write_bundle(tmp_path)
    save_bundle(bundle, tmp_path)
    assert load_bundle(tmp_path) == bundle


def test_load_bundle_names_missing_files(tmp_path: Path, bundle: Bundle) -> None:
    save_bundle(bundle, tmp_path)
    (tmp_path / "ca.key").unlink()
    with pytest.raises(CertError, match=r"missing ca\.key.*fairgate certs generate"):
        load_bundle(tmp_path)


def test_load_bundle_refuses_a_key_that_does_not_match(tmp_path: Path, bundle: Bundle) -> None:
    save_bundle(bundle, tmp_path)
    (tmp_path / "tls.key").write_bytes(new_bundle(now=NOW).key_pem)
    with pytest.raises(CertError, match=r"tls\.key: private key does not match"):
        load_bundle(tmp_path)


def test_load_bundle_refuses_garbage(tmp_path: Path, bundle: Bundle) -> None:
    save_bundle(bundle, tmp_path)
    (tmp_path / "tls.crt").write_bytes(b"not a certificate")
    with pytest.raises(CertError, match="unreadable certificate"):
        load_bundle(tmp_path)


@pytest.mark.parametrize(
    ("service", "namespace", "extra", "message"),
    [
        ("Fairgate", "fairgate-system", [], "not a valid Kubernetes Service name"),
        ("1hook", "fairgate-system", [], "not a valid Kubernetes Service name"),
        ("hook", "fairgate_system", [], "not a valid Kubernetes namespace"),
        ("hook", "ns", ["bad_name.example"], "neither an IP address nor a DNS name"),
        ("hook", "ns", ["a..b"], "neither an IP address nor a DNS name"),
        ("hook", "ns", [""], "neither an IP address nor a DNS name"),
    ],
)
def test_bad_names_are_refused_with_the_fix(
    service: str, namespace: str, extra: list[str], message: str
) -> None:
    with pytest.raises(CertError, match=message):
        new_bundle(service, namespace, extra)


SERVICE_NAME = st.from_regex(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
NAMESPACE = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)


@settings(max_examples=25, deadline=None)
@given(service=SERVICE_NAME, namespace=NAMESPACE)
def test_any_valid_service_and_namespace_get_a_verifiable_cert(
    service: str, namespace: str
) -> None:
    b = new_bundle(service, namespace, now=NOW)
    forms = [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
    forms.append(f"{service}.{namespace}.svc.cluster.local")
    assert sans(b.cert) == [x509.DNSName(n) for n in forms]
    for name in forms:
        verify(b, x509.DNSName(name))

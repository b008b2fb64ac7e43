"""Each deployment's own certificate authority, and the key and certificate of every part.

Built on `cryptography` (no home-made crypto): EC P-256 keys, X.509 certificates whose only
name is a SPIFFE-style URI SAN (spiffe://complyroute/<kind>/<name>), the identity Envoy hands
to OPA as ext_authz's source principal and the services check (services/app.js). A new CA
is made for every deployment and its key is never written: certificates are issued once, at
render time, and a later deployment's parts do not trust this one's.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TRUST_DOMAIN = "complyroute"
# Long enough for any experiment; a deployment is re-keyed every time it is deployed.
VALIDITY = datetime.timedelta(days=30)


def spiffe_id(kind: str, name: str) -> str:
    """The identity of a part: kind is "service", "point" or "control"."""
    return f"spiffe://{TRUST_DOMAIN}/{kind}" + (f"/{name}" if name else "")


CONTROL = spiffe_id("control", "")


@dataclass(frozen=True)
class Credential:
    """A part's private key and certificate, PEM."""

    identity: str
    key_pem: bytes
    cert_pem: bytes


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


class CertificateAuthority:
    """One deployment's CA: issues a credential per part, from memory."""

    def __init__(self, name: str):
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, TRUST_DOMAIN), x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        self._name = subject
        self._start = now - datetime.timedelta(minutes=5)  # a little clock skew between parts
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._start)
            .not_valid_after(self._start + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, identity: str) -> Credential:
        """A key and a certificate for `identity`, usable as TLS server and client."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, TRUST_DOMAIN)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._start)
            .not_valid_after(self._start + VALIDITY)
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)]), critical=True)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return Credential(identity, _pem_key(key), cert.public_bytes(serialization.Encoding.PEM))


def signing_key() -> tuple[dict, dict]:
    """A fresh EC P-256 key for label tokens (ES256), as (private JWK, public JWKS)."""
    key = ec.generate_private_key(ec.SECP256R1())
    numbers = key.private_numbers()

    def b64(value: int) -> str:
        import base64

        return base64.urlsafe_b64encode(value.to_bytes(32, "big")).rstrip(b"=").decode()

    public = {"kty": "EC", "crv": "P-256", "x": b64(numbers.public_numbers.x), "y": b64(numbers.public_numbers.y), "alg": "ES256", "use": "sig", "kid": "entry"}
    return {**public, "d": b64(numbers.private_value)}, {"keys": [public]}

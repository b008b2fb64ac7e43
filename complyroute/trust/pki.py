"""Each deployment's own certificate authority, and the key and certificate of every part.

Built on `cryptography` (no home-made crypto): EC P-256 keys, X.509 certificates whose only
name is a SPIFFE-style URI SAN (spiffe://complyroute/<kind>/<name>), the identity Envoy hands
to OPA as ext_authz's source principal and the services check (services/src/routes.js). A new CA
is made for every deployment and its key is never written: certificates are issued once, at
render time, and a later deployment's parts do not trust this one's.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from complyroute.trust.spiffe import BUNDLE_SERVER, CONTROL, MONITORING, TRUST_DOMAIN, spiffe_id

# Long enough for any experiment; a deployment is re-keyed every time it is deployed.
VALIDITY = datetime.timedelta(days=30)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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

    def issue(self, identity: str, hosts: tuple[str, ...] = ()) -> Credential:
        """A key and a certificate for `identity`, usable as TLS server and client.

        `hosts`: names (DNS or IP address) the certificate also carries, for a server whose
        clients check the host they reach (OPA's bundle download does; the parts check the URI).
        """
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.UniformResourceIdentifier(identity)] + [
            x509.IPAddress(ipaddress.ip_address(host)) if _is_ip(host) else x509.DNSName(host) for host in hosts
        ]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, TRUST_DOMAIN)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._start)
            .not_valid_after(self._start + VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=True)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return Credential(identity, _pem_key(key), cert.public_bytes(serialization.Encoding.PEM))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signing_key() -> tuple[dict, dict]:
    """A fresh EC P-256 key for label tokens (ES256), as (private JWK, public JWKS)."""
    numbers = ec.generate_private_key(ec.SECP256R1()).private_numbers()
    coordinate = lambda value: _b64(value.to_bytes(32, "big"))
    public = {"kty": "EC", "crv": "P-256", "x": coordinate(numbers.public_numbers.x), "y": coordinate(numbers.public_numbers.y),
              "alg": "ES256", "use": "sig", "kid": "entry"}
    return {**public, "d": coordinate(numbers.private_value)}, {"keys": [public]}


def sign_token(claims: dict, jwk: dict) -> str:
    """A compact JWS (ES256: ECDSA P-256 with SHA-256, the signature as raw r || s) over `claims`
    with the private JWK `jwk`: a label token as the entry's OPA issues it, for what plays the
    entry's part (make bench, the end-to-end tests, and a deploy's warm-up record, which names no
    label: runtime/local/warmup.py). A record the deployment lets in is signed only by OPA."""
    key = ec.derive_private_key(int.from_bytes(_unb64(jwk["d"]), "big"), ec.SECP256R1())
    header = {"alg": "ES256", "typ": "JWT", "kid": jwk["kid"]}
    signing_input = ".".join(_b64(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims))
    r, s = utils.decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

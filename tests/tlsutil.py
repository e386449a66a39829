"""Test certificates: a private CA and leaf certificates for 127.0.0.1 / localhost (cryptography)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec


@dataclass
class CertAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path  # the CA certificate as PEM, for clients to trust

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.path))

    def issue(self, cert_path: Path, key_path: Path, serial: int | None = None,
              ips: tuple[str, ...] = ("127.0.0.1",)) -> int:
        """Write a leaf for ``ips`` (default 127.0.0.1) and localhost signed by this CA; returns its serial."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(tz=datetime.UTC)
        serial = serial or x509.random_serial_number()
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "render-broker test")]))
                .issuer_name(self.cert.subject).public_key(key.public_key()).serial_number(serial)
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips)]),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return serial


def make_ca(directory: Path) -> CertAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "render-broker test CA")])
    now = datetime.datetime.now(tz=datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path = directory / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return CertAuthority(key, cert, path)


def served_serial(host: str, port: int, ca: CertAuthority) -> int:
    """Open a fresh TLS connection and return the serial number of the certificate the server shows."""
    import socket

    with socket.create_connection((host, port), timeout=5) as raw, \
            ca.client_context().wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number

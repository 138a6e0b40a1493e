"""Package indexes for the tests, on 127.0.0.1: a PEP 503 "simple" index over HTTPS whose certificate a private CA
signed (a company mirror or a private index, as a host's pip.conf names it with `cert =`), holding real wheels."""
from __future__ import annotations

import base64
import datetime
import hashlib
import http.server
import ipaddress
import shutil
import socketserver
import ssl
import threading
import zipfile
from pathlib import Path


def make_wheel(folder: Path, name: str, version: str, code: str) -> Path:
    """A real, minimal pure-Python wheel (RECORD with hashes), built by hand."""
    mod = name.replace("-", "_")
    dist = f"{mod}-{version}.dist-info"
    files = {f"{mod}/__init__.py": code,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpuops-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return whl


def _ca_and_cert(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for 127.0.0.1, written as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuops test company CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    ca_pem, cert_pem, key_pem = folder / "company-ca.pem", folder / "server.pem", folder / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return ca_pem, cert_pem, key_pem


class TlsIndex:
    """A simple index on https://127.0.0.1:PORT/simple/ signed by its own CA (`ca`: the PEM a pip.conf names)."""

    def __init__(self, folder: Path):
        self.folder = folder
        (folder / "simple").mkdir(parents=True, exist_ok=True)
        (folder / "files").mkdir(exist_ok=True)
        self.ca, cert, key = _ca_and_cert(folder / "tls")
        root = folder
        self.requests: list[str] = []
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(root), **kw)

            def do_GET(self):
                index.requests.append(self.path)
                super().do_GET()

            def log_message(self, *a):
                pass

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/simple/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, whl: Path, project: str) -> None:
        """List `whl` on `project`'s page (beside the versions added before)."""
        d = self.folder / "simple" / project
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(whl, self.folder / "files" / whl.name)
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        page = d / "index.html"
        links = page.read_text().split("<body>", 1)[1].rsplit("</body>", 1)[0] if page.is_file() else ""
        links += f'<a href="../../files/{whl.name}#sha256={digest}">{whl.name}</a>'  # every version a project has
        page.write_text(f"<html><body>{links}</body></html>\n")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

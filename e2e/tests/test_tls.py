"""TLS through the real binaries (docs/security.md "TLS"), certificates
made by the test (``cryptography``): an EPD deployment whose encoder,
prefill and decode workers serve gRPC over TLS and ask for the gateway's
client certificate (``--tls-cert-file``, ``--tls-client-ca-file``), reached
as ``grpcs://localhost:PORT`` (``--worker-tls-ca-file``,
``--worker-tls-cert-file``), behind a gateway serving HTTPS: the official
OpenAI client, trusting the test CA, chats about images (the answer
depends on the pixels, so the encoder was reached); a client that does
not trust the CA is refused; metrics and probes stay on the plain
``--metrics-port``.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import (STARTUP_TIMEOUT, Processes, binary, free_port, metric, start_encoder,
                      start_engine, wait_until)
from test_epd import ask, data_url, image_part, png


def name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def write_key(path: Path, key) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


class CertAuthority:
    """A CA made for the test and the certificates it signs, as PEM files."""

    def __init__(self, root: Path, common: str):
        self.root = root
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        self.name = name(common)
        self.cert = (x509.CertificateBuilder()
                     .subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(True, False, False, False, False, True, True,
                                                  False, False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.file = write_cert(root / f"{common}-ca.pem", self.cert)

    def issue(self, stem: str, server: bool) -> tuple[Path, Path]:
        """A server certificate for localhost and 127.0.0.1, or a client
        certificate: (certificate file, key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (x509.CertificateBuilder()
                   .subject_name(name(stem)).issuer_name(self.name)
                   .public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if server:
            sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return (write_cert(self.root / f"{stem}.crt", cert),
                write_key(self.root / f"{stem}.key", key))


@pytest.fixture(scope="module")
def secured(model_dir, tmp_path_factory):
    """An EPD deployment with TLS on every gRPC and client hop."""
    root = tmp_path_factory.mktemp("tls")
    ca = CertAuthority(root, "fleet")
    worker_cert, worker_key = ca.issue("worker", server=True)
    gateway_cert, gateway_key = ca.issue("gateway", server=True)
    client_cert, client_key = ca.issue("gateway-client", server=False)
    serve_tls = ("--tls-cert-file", worker_cert, "--tls-key-file", worker_key,
                 "--tls-client-ca-file", ca.file)
    procs = Processes(root)
    try:
        encoder = start_encoder(procs, model_dir, *serve_tls)
        prefill = start_engine(procs, model_dir, "prefill", *serve_tls)
        decode = start_engine(procs, model_dir, "decode", *serve_tls)
        grpcs = lambda engine: f"grpcs://localhost:{engine.grpc_port}"  # noqa: E731
        port, metrics_port = free_port(), free_port()
        args = [binary("iris"), "serve", "--host", "127.0.0.1", "--port", port,
                "--metrics-port", metrics_port, "--model-path", model_dir,
                "--epd-disaggregation", "--encode", grpcs(encoder), str(encoder.data_port),
                "--prefill", grpcs(prefill), str(prefill.data_port), "--decode", grpcs(decode),
                "--worker-tls-ca-file", ca.file, "--worker-tls-cert-file", client_cert,
                "--worker-tls-key-file", client_key,
                "--tls-cert-file", gateway_cert, "--tls-key-file", gateway_key]
        gateway = procs.spawn("gateway", args)
        probes = f"http://127.0.0.1:{metrics_port}"

        def ready():
            if gateway.popen.poll() is not None:
                pytest.fail(f"gateway exited:\n{gateway.log_tail()}")
            try:
                return httpx.get(f"{probes}/readiness", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, STARTUP_TIMEOUT, "the TLS gateway's readiness")
        yield {"url": f"https://localhost:{port}", "probes": probes, "ca": ca.file,
               "model": model_dir.name}
    finally:
        procs.stop_all()


def trusting(ca: Path) -> httpx.Client:
    return httpx.Client(verify=ssl.create_default_context(cafile=str(ca)), timeout=60)


def test_the_openai_client_chats_about_images_over_tls_end_to_end(secured):
    http = trusting(secured["ca"])
    client = openai.OpenAI(base_url=f"{secured['url']}/v1", api_key="unused",
                           max_retries=0, http_client=http)
    try:
        first = ask(client, secured["model"], image_part(data_url(png(64, 64, seed=1))))
        again = ask(client, secured["model"], image_part(data_url(png(64, 64, seed=1))))
        other = ask(client, secured["model"], image_part(data_url(png(64, 64, seed=9))))
        streamed = ask(client, secured["model"], image_part(data_url(png(64, 64, seed=1))),
                       stream=True)
    finally:
        client.close()
    assert first and first == again == streamed
    assert other != first, "the answer depends on the pixels the encoder saw"
    text = httpx.get(f"{secured['probes']}/metrics", timeout=10).text
    assert metric(text, "iris_tls_certificate_reloads_total", result="refused") == 0
    for role in ("encode", "prefill", "decode"):
        assert f'role="{role}"' in text and "grpcs://localhost:" in text


def test_a_client_that_does_not_trust_the_ca_is_refused(secured):
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{secured['url']}/health", timeout=10)
    with pytest.raises(httpx.HTTPError):
        httpx.get(secured["url"].replace("https://", "http://") + "/health", timeout=10)
    answer = trusting(secured["ca"]).get(f"{secured['url']}/health")
    assert answer.status_code == 200 and answer.json() == {"status": "ok"}

    def counted():
        text = httpx.get(f"{secured['probes']}/metrics", timeout=10).text
        return (metric(text, "iris_tls_handshake_failures_total", listener="api") or 0) >= 2

    wait_until(counted, 10, "the refused handshakes counted")

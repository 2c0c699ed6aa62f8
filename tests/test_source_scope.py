"""A long-lived Loader keeps one source per store, and a store's credentials stay in it.

An Azure blob is read over https:// with the account's SAS (or a SAS made from its
key); a later https:// URL on another host must be read as plain HTTP and see none of
it. Both servers are real TLS servers on 127.0.0.1 (tests/http_server.py), behind a
test CA; ``<account>.blob.core.windows.net`` reaches the first through a CONNECT
proxy, the way any https:// host is reached behind ``HTTPS_PROXY``. The loads run in a
child process, which trusts the test CA from its start (``SSL_CERT_FILE``).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file

from aioloader.sources.auto import store_of

from .helpers import assert_matches_files, some_big, write_file
from .http_server import FaultyHttpServer
from .socket_server import SocketServer

ACCOUNT = "devstoreaccount1"
AZURE_HOST = f"{ACCOUNT}.blob.core.windows.net"
SECRET = "sig=NotForOtherHosts"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

CHILD = """
import asyncio, sys
from safetensors.torch import save_file
from aioloader import Loader

async def main(out, urls):
    async with Loader() as loader:
        for i, url in enumerate(urls):
            save_file(await loader.load(url), f"{out}/{i}.safetensors")

asyncio.run(main(sys.argv[1], sys.argv[2:]))
"""


def _certificates(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A test CA (its PEM file) and a server context for AZURE_HOST and 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    hour = datetime.timedelta(hours=1)

    def builder(
        subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - hour)
            .not_valid_after(now + hour)
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aioloader test CA")])
    usage = dict.fromkeys(
        ("content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
         "encipher_only", "decipher_only"), False,
    )  # fmt: skip
    ca = (
        builder("aioloader test CA", ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, **usage),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(AZURE_HOST), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    leaf = (
        builder(AZURE_HOST, ca_name, key)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


class ConnectProxy(SocketServer):
    """An HTTP CONNECT proxy on 127.0.0.1 that sends each ``host:port`` in ``routes`` to
    the local port given there, and refuses every other target."""

    def __init__(self, routes: dict[str, int]) -> None:
        super().__init__()
        self.routes = routes
        self.targets: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            method, target = request.decode("latin-1").split()[:2]
            self.targets.append(target)
            port = self.routes.get(target)
            if method != "CONNECT" or port is None:
                writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if upstream is not None:
                upstream.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    return _certificates(tmp_path)


@pytest.fixture
def servers(
    tmp_path: Path, tls: tuple[Path, ssl.SSLContext]
) -> Iterator[tuple[FaultyHttpServer, FaultyHttpServer]]:
    azure, other = tmp_path / "azure", tmp_path / "other"
    write_file(azure / "models" / "m" / "model.safetensors", some_big(11))
    write_file(other / "m" / "model.safetensors", some_big(12))
    with (
        FaultyHttpServer(azure, ssl_context=tls[1]) as account,
        FaultyHttpServer(other, ssl_context=tls[1]) as stranger,
    ):
        yield account, stranger


def _child_env(ca: Path, proxy: int, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AZURE_") and k.lower() not in ("http_proxy", "https_proxy", "no_proxy")
    }
    env.update(SSL_CERT_FILE=str(ca), HTTPS_PROXY=f"http://127.0.0.1:{proxy}", NO_PROXY="127.0.0.1")
    env.update(extra)
    return env


@pytest.mark.parametrize("credential", ["sas", "key", "sas-of-another-account"])
async def test_an_azure_credential_never_reaches_a_later_https_host(
    servers: tuple[FaultyHttpServer, FaultyHttpServer],
    tls: tuple[Path, ssl.SSLContext],
    tmp_path: Path,
    credential: str,
) -> None:
    account, stranger = servers
    extra = {
        "sas": {"AZURE_STORAGE_SAS_TOKEN": f"sv=2021-08-06&{SECRET}"},
        "key": {"AZURE_STORAGE_KEY": KEY},
        # Named for another account: not this account's to send.
        "sas-of-another-account": {
            "AZURE_STORAGE_SAS_TOKEN": f"sv=2021-08-06&{SECRET}",
            "AZURE_STORAGE_ACCOUNT_NAME": "someoneelse",
        },
    }[credential]
    out = tmp_path / "out"
    out.mkdir()
    azure_url = f"https://{AZURE_HOST}/models/m/model.safetensors"
    other_url = f"{stranger.url}/m/model.safetensors"
    async with ConnectProxy({f"{AZURE_HOST}:443": account.port}) as proxy:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, str(out), azure_url, other_url,
            env=_child_env(tls[0], proxy.port, **extra),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await child.communicate()
    assert child.returncode == 0, output.decode()[-3000:]
    assert proxy.targets and set(proxy.targets) == {f"{AZURE_HOST}:443"}
    assert_matches_files(
        load_file(str(out / "0.safetensors")), account.root / "models/m/model.safetensors"
    )
    assert_matches_files(
        load_file(str(out / "1.safetensors")), stranger.root / "m/model.safetensors"
    )

    sent_to_account = " ".join(account.query_strings)
    if credential == "sas-of-another-account":
        assert "sig=" not in sent_to_account
    else:
        assert "sig=" in sent_to_account  # the account's own requests carry it
    assert stranger.requests
    for query, headers in zip(stranger.query_strings, stranger.request_headers, strict=True):
        assert "sig=" not in query and not query, query
        assert "authorization" not in {k.lower() for k in headers}
        assert "x-ms-version" not in {k.lower() for k in headers}  # read as plain HTTP


def test_stores_are_accounts_for_azure_and_schemes_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "named")
    a = store_of("https://one.blob.core.windows.net/c/m.safetensors?sig=x")
    assert a == store_of("https://ONE.blob.core.windows.net/c/other.safetensors")
    assert a != store_of("https://two.blob.core.windows.net/c/m.safetensors")
    assert a != store_of("https://example.com/c/m.safetensors") == "https"
    assert "sig" not in a
    assert store_of("az://c/m") == store_of("https://named.blob.core.windows.net/d/m")
    assert store_of("az://c/m") != a
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING", "AccountName=named;BlobEndpoint=http://127.0.0.1:1/x"
    )
    assert store_of("az://c/m") != store_of("https://named.blob.core.windows.net/d/m")
    assert store_of("s3://b/k") == "s3" and store_of("gs://b/k") == "gs"

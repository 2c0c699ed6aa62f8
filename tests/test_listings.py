"""Listings and metadata that are not the store's: named errors, never a parser's own.

A proxy's login page, a misconfigured endpoint or a broken emulator answers a GCS
metadata request, an Azure container listing or an S3 ListObjectsV2 with HTML, another
document or one missing its fields. ``DocServer`` is a real HTTP server on 127.0.0.1
that answers every GET with one such document.
"""

from __future__ import annotations

import asyncio

import pytest

from aioloader import S3Options, SourceError, load_model

from .socket_server import SocketServer

HTML = b"<html><body>Please log in</body></html"


class DocServer(SocketServer):
    """Answers every GET with ``200`` and ``body``, and records the paths asked for."""

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.body = body
        self.paths: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                request = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            self.paths.append(request.split()[1].decode())
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(self.body)}\r\n\r\n"
            writer.write(head.encode() + self.body)
            await writer.drain()


GCS_METADATA = [
    (HTML, "not JSON"),
    (b"[1, 2]", "JSON list, not an object"),
    (b'{"size": "10"}', "no generation"),
    (b'{"generation": {"x": 1}}', "no generation"),
    (b"\xff\xfe{}", "not JSON"),
]


@pytest.mark.parametrize(("body", "problem"), GCS_METADATA)
async def test_gcs_metadata_that_is_not_cloud_storage_s(
    monkeypatch: pytest.MonkeyPatch, body: bytes, problem: str
) -> None:
    async with DocServer(body) as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
        with pytest.raises(SourceError, match=problem) as info:
            await load_model("gs://bkt/model.safetensors")
    message = str(info.value)
    assert "gs://bkt/model.safetensors" in message and server.url in message
    assert "object metadata" in message and "STORAGE_EMULATOR_HOST" in message


GCS_LISTINGS = [
    (HTML, "not JSON"),
    (b'{"items": {"name": "a"}}', "not objects with a name"),
    (b'{"items": [{"size": 1}]}', "not objects with a name"),
    (b'{"items": [{"name": 7}]}', "not objects with a name"),
    (b'{"items": [], "nextPageToken": 5}', "nextPageToken"),
]


@pytest.mark.parametrize(("body", "problem"), GCS_LISTINGS)
async def test_gcs_listings_that_are_not_cloud_storage_s(
    monkeypatch: pytest.MonkeyPatch, body: bytes, problem: str
) -> None:
    async with DocServer(body) as server:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
        with pytest.raises(SourceError, match=problem) as info:
            await load_model("gs://bkt/llm/")
    assert "gs://bkt/llm/" in str(info.value) and "listing" in str(info.value)
    assert any("/storage/v1/b/bkt/o?" in p for p in server.paths)


XML_LISTINGS = [
    (HTML, "not XML"),
    (b"<Error><Code>Nope</Code></Error>", "root element is <Error>"),
]
AZURE_LISTINGS = [
    *XML_LISTINGS,
    (
        b"<EnumerationResults><Blobs><Blob><Properties/></Blob></Blobs></EnumerationResults>",
        "a <Blob> has no <Name>",
    ),
]


@pytest.mark.parametrize(("body", "problem"), AZURE_LISTINGS)
async def test_azure_listings_that_are_not_azure_s(
    monkeypatch: pytest.MonkeyPatch, body: bytes, problem: str
) -> None:
    for name in ("AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY"):
        monkeypatch.delenv(name, raising=False)
    async with DocServer(body) as server:
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING",
            f"AccountName=acct;BlobEndpoint={server.url}/acct",
        )
        with pytest.raises(SourceError, match=problem) as info:
            await load_model("az://box/llm/")
    assert "az://box/llm/" in str(info.value) and f"{server.url}/acct" in str(info.value)


S3_LISTINGS = [
    *XML_LISTINGS,
    (
        b'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Contents><Size>3</Size></Contents></ListBucketResult>",
        "a <Contents> has no <Key>",
    ),
]


@pytest.mark.parametrize(("body", "problem"), S3_LISTINGS)
async def test_s3_listings_that_are_not_s3_s(body: bytes, problem: str) -> None:
    async with DocServer(body) as server:
        s3 = S3Options(endpoint_url=server.url, region="us-east-1", anonymous=True)
        with pytest.raises(SourceError, match=problem) as info:
            await load_model("s3://bkt/llm/", s3=s3)
    assert "s3://bkt/llm/" in str(info.value) and server.url in str(info.value)

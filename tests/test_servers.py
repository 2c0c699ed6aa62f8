"""The test servers themselves: plain HTTP semantics, each fault, and moto's S3 behaviour."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import botocore.exceptions
import botocore.session
import pytest
import torch
from safetensors.torch import save_file

from .fixtures_remote import *  # noqa: F403  (the fixtures, until conftest imports them)
from .http_server import FaultyHttpServer, RequestRecord
from .s3_server import MotoS3Server

SIZE = 300_000  # several 64 KiB chunks, not a multiple of one


@pytest.fixture
def blob(http_server: FaultyHttpServer) -> bytes:
    data = os.urandom(SIZE)
    (http_server.root / "blob.bin").write_bytes(data)
    return data


async def read_until_error(resp: aiohttp.ClientResponse) -> tuple[bytes, BaseException | None]:
    """Body bytes received before the stream failed, and the failure."""
    got = bytearray()
    try:
        async for piece in resp.content.iter_any():
            got += piece
    except (aiohttp.ClientError, ConnectionError) as exc:
        return bytes(got), exc
    return bytes(got), None


# -- plain HTTP ---------------------------------------------------------------------------


async def test_whole_body_and_headers(http_server: FaultyHttpServer, blob: bytes) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(http_server.url_for("blob.bin")) as resp:
            assert resp.status == 200
            assert await resp.read() == blob
            etag = resp.headers["ETag"]
            assert etag.startswith('"') and etag.endswith('"')
            assert resp.headers["Last-Modified"].endswith("GMT")
            assert resp.headers["Accept-Ranges"] == "bytes"
            assert resp.headers["Content-Length"] == str(SIZE)
        async with session.get(http_server.url_for("missing.bin")) as resp:
            assert resp.status == 404
    assert http_server.requests == [
        RequestRecord("GET", "blob.bin", None),
        RequestRecord("GET", "missing.bin", None),
    ]
    assert http_server.bytes_sent == SIZE
    http_server.reset_counters()
    assert http_server.requests == [] and http_server.bytes_sent == 0


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [
        ("bytes=10-19", 10, 19),
        ("bytes=299990-", 299_990, SIZE - 1),
        ("bytes=-5", SIZE - 5, SIZE - 1),
        ("bytes=299995-400000", 299_995, SIZE - 1),
        ("bytes=-999999", 0, SIZE - 1),
    ],
)
async def test_ranges(
    http_server: FaultyHttpServer, blob: bytes, header: str, first: int, last: int
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(http_server.url_for("blob.bin"), headers={"Range": header}) as resp:
            assert resp.status == 206
            assert resp.headers["Content-Range"] == f"bytes {first}-{last}/{SIZE}"
            assert resp.headers["Content-Length"] == str(last - first + 1)
            assert await resp.read() == blob[first : last + 1]
    assert http_server.requests == [RequestRecord("GET", "blob.bin", header)]


async def test_unsatisfiable_range_and_head(http_server: FaultyHttpServer, blob: bytes) -> None:
    url = http_server.url_for("blob.bin")
    async with aiohttp.ClientSession() as session:
        for header in (f"bytes={SIZE}-", "bytes=-0"):
            async with session.get(url, headers={"Range": header}) as resp:
                assert resp.status == 416
                assert resp.headers["Content-Range"] == f"bytes */{SIZE}"
        async with session.head(url) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Length"] == str(SIZE)
            assert "ETag" in resp.headers
            assert await resp.read() == b""
        async with session.head(url, headers={"Range": "bytes=0-9"}) as resp:
            assert resp.status == 206
            assert resp.headers["Content-Range"] == f"bytes 0-9/{SIZE}"
    assert http_server.bytes_sent == 0


async def test_if_match(http_server: FaultyHttpServer, blob: bytes) -> None:
    url = http_server.url_for("blob.bin")
    async with aiohttp.ClientSession() as session:
        async with session.head(url) as resp:
            etag = resp.headers["ETag"]
        headers = {"Range": "bytes=0-3", "If-Match": etag}
        async with session.get(url, headers=headers) as resp:
            assert resp.status == 206
            assert await resp.read() == blob[:4]
        async with session.get(url, headers={"If-Match": '"other"'}) as resp:
            assert resp.status == 412
            assert resp.headers["ETag"] == etag


# -- faults -------------------------------------------------------------------------------


async def test_reset_after(http_server: FaultyHttpServer, blob: bytes) -> None:
    http_server.reset_after("blob.bin", 100_000)
    url = http_server.url_for("blob.bin")
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            assert resp.status == 200
            got, error = await read_until_error(resp)
        assert isinstance(error, aiohttp.ClientPayloadError | aiohttp.ClientOSError)
        assert got == blob[:100_000]
        # The fault is spent: the next GET is whole.
        async with session.get(url) as resp:
            assert await resp.read() == blob


async def test_reset_before_any_body(http_server: FaultyHttpServer, blob: bytes) -> None:
    http_server.reset_after(None, 0)
    async with aiohttp.ClientSession() as session:
        async with session.get(http_server.url_for("blob.bin")) as resp:
            got, error = await read_until_error(resp)
    assert got == b"" and error is not None


async def test_short_body(http_server: FaultyHttpServer, blob: bytes) -> None:
    http_server.short_body("blob.bin")
    async with aiohttp.ClientSession() as session:
        async with session.get(
            http_server.url_for("blob.bin"), headers={"Range": "bytes=1000-"}
        ) as resp:
            assert resp.status == 206
            got, error = await read_until_error(resp)
    assert isinstance(error, aiohttp.ClientPayloadError)
    assert got == blob[1000 : 1000 + (SIZE - 1000) // 2]


async def test_stall(http_server: FaultyHttpServer, blob: bytes) -> None:
    url = http_server.url_for("blob.bin")
    http_server.stall("blob.bin", 0.4, after_bytes=5000)
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        async with session.get(url) as resp:
            assert await resp.read() == blob
        assert time.monotonic() - start >= 0.4

        http_server.stall("blob.bin", 1.0, after_bytes=5000)
        timeout = aiohttp.ClientTimeout(sock_read=0.2)
        async with session.get(url, timeout=timeout) as resp:
            got, error = await read_until_error(resp)
        assert got == blob[:5000]
        assert isinstance(error, asyncio.TimeoutError | aiohttp.ClientError)

        http_server.stall(None, 0.3, before_headers=True)
        start = time.monotonic()
        async with session.get(url) as resp:
            assert await resp.read() == blob
        assert time.monotonic() - start >= 0.3


async def test_status(http_server: FaultyHttpServer, blob: bytes) -> None:
    url = http_server.url_for("blob.bin")
    http_server.status("blob.bin", 503, count=2, retry_after=1, body=b"busy")
    http_server.status(None, 404)
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.get(url) as resp:
                assert resp.status == 503
                assert resp.headers["Retry-After"] == "1"
                assert await resp.read() == b"busy"
        async with session.get(url) as resp:
            assert resp.status == 404
        async with session.get(url) as resp:
            assert resp.status == 200
            assert await resp.read() == blob


async def test_faults_apply_to_gets_only(http_server: FaultyHttpServer, blob: bytes) -> None:
    url = http_server.url_for("blob.bin")
    http_server.status(None, 500)
    async with aiohttp.ClientSession() as session:
        async with session.head(url) as resp:
            assert resp.status == 200
        async with session.get(url) as resp:
            assert resp.status == 500


async def test_ignore_range(http_server: FaultyHttpServer, blob: bytes) -> None:
    url = http_server.url_for("blob.bin")
    http_server.ignore_range("blob.bin")
    async with aiohttp.ClientSession() as session:
        for _ in range(2):  # persistent, not one-shot
            async with session.get(url, headers={"Range": "bytes=0-9"}) as resp:
                assert resp.status == 200
                assert "Content-Range" not in resp.headers
                assert await resp.read() == blob
        http_server.ignore_range("blob.bin", enabled=False)
        async with session.get(url, headers={"Range": "bytes=0-9"}) as resp:
            assert resp.status == 206
            assert await resp.read() == blob[:10]


async def test_change_after(http_server: FaultyHttpServer, tmp_path: Path) -> None:
    file = http_server.root / "model.safetensors"
    save_file({"w": torch.arange(1000, dtype=torch.float32)}, str(file))
    original = file.read_bytes()
    data_start = 8 + int.from_bytes(original[:8], "little")
    url = http_server.url_for("model.safetensors")

    http_server.change_after("model.safetensors", 2)
    async with aiohttp.ClientSession() as session:
        etags = []
        for _ in range(2):  # these two still see the first version
            async with session.get(url) as resp:
                assert await resp.read() == original
                etags.append(resp.headers["ETag"])
        assert etags[0] == etags[1]
        assert http_server.version("model.safetensors") == 1

        async with session.get(url, headers={"If-Match": etags[0]}) as resp:
            assert resp.status == 412
        async with session.get(url, headers={"Range": f"bytes={data_start}-"}) as resp:
            assert resp.status == 206
            assert resp.headers["ETag"] != etags[0]
            changed_tail = await resp.read()
        async with session.get(url) as resp:
            changed = await resp.read()
    assert changed[:data_start] == original[:data_start]  # the header still parses
    assert changed[data_start:] != original[data_start:]
    assert changed[data_start:] == changed_tail
    assert len(changed) == len(original)
    assert file.read_bytes() == original  # the file on disk is untouched


async def test_redirects(http_server: FaultyHttpServer, blob: bytes, tmp_path: Path) -> None:
    http_server.redirect("old.bin", "blob.bin")
    other_root = tmp_path / "other"
    other_root.mkdir()
    (other_root / "x.bin").write_bytes(b"elsewhere")
    async with aiohttp.ClientSession() as session:
        async with session.get(http_server.url_for("old.bin"), allow_redirects=False) as resp:
            assert resp.status == 302
            assert resp.headers["Location"] == http_server.url_for("blob.bin")
        async with session.get(http_server.url_for("old.bin")) as resp:
            assert await resp.read() == blob
        async with session.head(http_server.url_for("old.bin"), allow_redirects=False) as resp:
            assert resp.status == 302

        with FaultyHttpServer(other_root) as other:
            http_server.redirect_all_to(other.url)
            async with session.get(http_server.url_for("x.bin")) as resp:
                assert await resp.read() == b"elsewhere"
            assert other.requests == [RequestRecord("GET", "x.bin", None)]


async def test_require_header(http_server: FaultyHttpServer, blob: bytes) -> None:
    http_server.require_header("Authorization", "Bearer secret")
    url = http_server.url_for("blob.bin")
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            assert resp.status == 401
        async with session.head(url, headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 401
        async with session.get(url, headers={"Authorization": "Bearer secret"}) as resp:
            assert resp.status == 200
            assert await resp.read() == blob
    assert http_server.request_headers[-1]["Authorization"] == "Bearer secret"


async def test_max_concurrent_and_limit(http_server: FaultyHttpServer, blob: bytes) -> None:
    url = http_server.url_for("blob.bin")

    async def get(session: aiohttp.ClientSession) -> int:
        async with session.get(url) as resp:
            await resp.read()
            return resp.status

    http_server.stall(None, 0.3, count=4)
    async with aiohttp.ClientSession() as session:
        statuses = await asyncio.gather(*(get(session) for _ in range(4)))
        assert statuses == [200] * 4
        assert http_server.max_concurrent == 4

        http_server.reset_counters()
        http_server.limit_concurrency(2, code=429, retry_after=0)
        http_server.stall(None, 0.3, count=2)
        results = await asyncio.gather(*(get(session) for _ in range(3)))
        assert sorted(results) == [200, 200, 429]
        assert http_server.max_concurrent == 3
        http_server.limit_concurrency(None)
        assert await get(session) == 200
    # The server thread counts a request done after its last byte left, which may be
    # a moment after the client has read it.
    for _ in range(200):
        if http_server.in_flight == 0:
            break
        await asyncio.sleep(0.005)
    assert http_server.in_flight == 0


def test_reachable_from_subprocess(http_server: FaultyHttpServer, blob: bytes) -> None:
    script = (
        "import sys, urllib.request\n"
        "req = urllib.request.Request(sys.argv[1], headers={'Range': 'bytes=0-99'})\n"
        "sys.stdout.buffer.write(urllib.request.urlopen(req).read())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, http_server.url_for("blob.bin")],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    assert out == blob[:100]


# -- moto S3 ------------------------------------------------------------------------------


def test_moto_upload_and_ranged_get(moto_server: MotoS3Server, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    data = os.urandom(100_000)
    (folder / "a.bin").write_bytes(data)
    (folder / "sub" / "b.json").write_text("{}")
    keys = moto_server.upload("ranged-bucket", "models/m1", folder)
    assert keys == ["models/m1/a.bin", "models/m1/sub/b.json"]
    assert moto_server.upload("ranged-bucket", "single", folder / "a.bin") == ["single/a.bin"]

    s3 = moto_server.client()
    try:
        got = s3.get_object(Bucket="ranged-bucket", Key="models/m1/a.bin", Range="bytes=100-199")
        assert got["ContentRange"] == "bytes 100-199/100000"
        assert got["Body"].read() == data[100:200]
        got["Body"].close()
        listed = s3.list_objects_v2(Bucket="ranged-bucket", Prefix="models/m1/")
        assert sorted(o["Key"] for o in listed["Contents"]) == keys
    finally:
        s3.close()


def test_moto_default_accepts_any_signature(moto_server: MotoS3Server) -> None:
    moto_server.create_bucket("any-sig-bucket")
    moto_server.put_object("any-sig-bucket", "k", b"data")
    s3 = moto_server.client(access_key="AKIAUNKNOWN", secret_key="wrong")
    try:
        assert s3.get_object(Bucket="any-sig-bucket", Key="k")["Body"].read() == b"data"
    finally:
        s3.close()


async def test_moto_anonymous_access(moto_server: MotoS3Server) -> None:
    moto_server.create_bucket("anon-bucket")
    moto_server.put_object("anon-bucket", "private", b"secret")
    moto_server.put_object("anon-bucket", "public", b"0123456789", ACL="public-read")
    moto_server.create_bucket("anon-policy-bucket")
    moto_server.put_object("anon-policy-bucket", "k", b"by policy")
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": "*",
                "Action": "s3:GetObject",
                "Resource": "arn:aws:s3:::anon-policy-bucket/*",
            }
        ],
    }
    s3 = moto_server.client()
    try:
        s3.put_bucket_policy(Bucket="anon-policy-bucket", Policy=json.dumps(policy))
    finally:
        s3.close()

    base = moto_server.endpoint
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/anon-bucket/private") as resp:
            assert resp.status == 403
        async with session.get(
            f"{base}/anon-bucket/public", headers={"Range": "bytes=2-4"}
        ) as resp:
            assert resp.status == 206
            assert await resp.read() == b"234"
        async with session.get(f"{base}/anon-policy-bucket/k") as resp:
            assert resp.status == 200
            assert await resp.read() == b"by policy"


def test_moto_enforced_auth(moto_auth_server: MotoS3Server) -> None:
    server = moto_auth_server
    assert server.credentials[0] != "testing"
    server.create_bucket("auth-bucket")
    server.put_object("auth-bucket", "k", b"guarded")

    good = server.client()
    unknown = server.client(access_key="testing", secret_key="testing")
    bad_secret = server.client(access_key=server.credentials[0], secret_key="wrong")
    try:
        assert (
            good.get_object(Bucket="auth-bucket", Key="k", Range="bytes=0-2")["Body"].read()
            == b"gua"
        )
        for client, code in (
            (unknown, "InvalidAccessKeyId"),
            (bad_secret, "SignatureDoesNotMatch"),
        ):
            with pytest.raises(botocore.exceptions.ClientError) as info:
                client.get_object(Bucket="auth-bucket", Key="k")
            assert info.value.response["Error"]["Code"] == code
            assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    finally:
        for client in (good, unknown, bad_secret):
            client.close()


def test_s3_env(s3_env: MotoS3Server, tmp_path: Path) -> None:
    assert os.environ["AWS_ENDPOINT_URL"] == s3_env.endpoint
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
    assert "AWS_PROFILE" not in os.environ
    assert not Path(os.environ["AWS_CONFIG_FILE"]).exists()
    s3_env.create_bucket("env-bucket")
    # A client configured by the environment alone reaches the server.
    s3 = botocore.session.Session().create_client("s3")
    try:
        names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    finally:
        s3.close()
    assert "env-bucket" in names

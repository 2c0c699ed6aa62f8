"""Which S3 checksum covers what (s3/checksums.py), and composite digests computed part
by part (digests.py), checked against checksums computed here from their definition."""

from __future__ import annotations

import base64
import hashlib
import os
import zlib

import pytest

from aioloader.sources.digests import Digest, computable
from aioloader.sources.s3.checksums import guess_parts, read_checksum, whole_only

MD5 = "0123456789abcdef0123456789abcdef"


def _raw(algorithm: str, data: bytes) -> bytes:
    if algorithm == "crc32":
        return zlib.crc32(data).to_bytes(4, "big")
    if algorithm == "crc32c":
        import google_crc32c

        return int(google_crc32c.value(data)).to_bytes(4, "big")
    return hashlib.new(algorithm, data).digest()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _composite(algorithm: str, data: bytes, parts: tuple[int, ...]) -> str:
    """S3's COMPOSITE checksum: of the parts' checksums, back to back."""
    digests, at = b"", 0
    for size in parts:
        digests += _raw(algorithm, data[at : at + size])
        at += size
    return _b64(_raw(algorithm, digests))


def _computed(digest: Digest, data: bytes, step: int) -> str:
    running = digest.running()
    assert running is not None
    for at in range(0, len(data), step):
        running.update(memoryview(data[at : at + step]))
    return running.result()


# -- what a HEAD's headers say --------------------------------------------------------


def test_real_s3_composite_and_full_object_answers() -> None:
    found = read_checksum(
        {"x-amz-checksum-crc32": "AAAAAA==-3", "x-amz-checksum-type": "COMPOSITE",
         "etag": f'"{MD5}-3"'}
    )  # fmt: skip
    assert found is not None and found.problem is None
    assert (found.kind, found.parts, found.value) == ("composite", 3, "AAAAAA==")
    full = read_checksum(
        {"x-amz-checksum-crc32": "AAAAAA==", "x-amz-checksum-type": "FULL_OBJECT",
         "etag": f'"{MD5}-3"'}
    )  # fmt: skip
    assert full is not None and (full.kind, full.problem) == ("whole", None)


def test_a_single_part_object_is_whole_and_a_silent_multipart_one_either() -> None:
    single = read_checksum({"x-amz-checksum-sha256": "x=", "etag": f'"{MD5}"'})
    assert single is not None and single.kind == "whole"
    silent = read_checksum({"x-amz-checksum-sha256": "x=", "etag": f'"{MD5}-4"'})  # moto's HEAD
    assert silent is not None and (silent.kind, silent.parts) == ("either", 4)
    suffixed = read_checksum({"x-amz-checksum-sha1": "x=-2"})
    assert suffixed is not None and (suffixed.kind, suffixed.parts) == ("composite", 2)


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"x-amz-checksum-crc32": "x=-3", "x-amz-checksum-type": "FULL_OBJECT"}, "FULL_OBJECT"),
        ({"x-amz-checksum-crc32": "x=", "x-amz-checksum-type": "COMPOSITE"}, "no part count"),
        ({"x-amz-checksum-crc32": "x=-3", "etag": f'"{MD5}-5"'}, "the ETag 5"),
        ({"x-amz-checksum-crc32": "x=-0"}, "0 parts"),
        ({"x-amz-checksum-crc32": "x=", "etag": f'"{MD5}-0"'}, "0 parts"),
        ({"x-amz-checksum-crc32": "x=-10001"}, "10001 parts"),
        ({"x-amz-checksum-crc32": "x=", "x-amz-checksum-type": "PARTIAL"}, "'PARTIAL'"),
        ({"x-amz-checksum-crc32": "x=-y"}, "no checksum"),
    ],
)
def test_a_checksum_that_does_not_add_up_is_not_checked(headers: dict[str, str], why: str) -> None:
    found = read_checksum(headers)
    assert found is not None and found.problem is not None and why in found.problem
    assert "x-amz-checksum-crc32" not in whole_only(headers)


def test_whole_only_hands_out_checksums_of_the_bytes_alone() -> None:
    sse = {"x-amz-server-side-encryption": "aws:kms"}
    assert whole_only({"x-amz-checksum-crc32": "x=", "etag": f'"{MD5}"', **sse}) == {
        "x-amz-checksum-crc32": "x=", "etag": f'"{MD5}"', **sse
    }  # fmt: skip
    silent = {"x-amz-checksum-crc32": "x=", "etag": f'"{MD5}-2"', **sse}
    assert whole_only(silent) == {"etag": f'"{MD5}-2"', **sse}
    assert read_checksum({}) is None and whole_only({}) == {}


@pytest.mark.skipif(not computable("crc64nvme"), reason="needs awscrt")
def test_crc64nvme_is_always_of_the_whole_object() -> None:
    found = read_checksum({"x-amz-checksum-crc64nvme": "x=", "etag": f'"{MD5}-3"'})
    assert found is not None and found.kind == "whole"


def test_part_sizes_guessed_from_the_first() -> None:
    assert guess_parts(17, 8, 3) == (8, 8, 1)
    assert guess_parts(16, 8, 2) == (8, 8)
    assert guess_parts(5, 5, 1) == (5,)
    assert guess_parts(17, 8, 2) is None  # the last would be larger than the first
    assert guess_parts(16, 8, 3) is None  # the last would be empty
    assert guess_parts(0, 0, 1) is None and guess_parts(8, 8, 0) is None


# -- composite digests computed part by part -----------------------------------------


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c", "sha1", "sha256"])
@pytest.mark.parametrize("step", [1 << 20, 1000, 7])
def test_a_composite_digest_is_of_each_parts_digest(algorithm: str, step: int) -> None:
    if not computable(algorithm):
        pytest.skip(f"{algorithm} needs its library")
    data = os.urandom(3000 if step == 7 else 200_000)
    parts = (len(data) // 3, len(data) // 3, len(data) - 2 * (len(data) // 3))
    want = _composite(algorithm, data, parts)
    digest = Digest(algorithm, want, "base64", "here", parts=parts)
    assert _computed(digest, data, step) == want
    changed = bytearray(data)
    changed[parts[0]] ^= 1  # the first byte of the second part
    assert _computed(digest, bytes(changed), step) != want
    # The same bytes cut into other parts have another composite checksum.
    other = Digest(algorithm, want, "base64", "here", parts=(parts[0] + 1, parts[1] - 1, parts[2]))
    assert _computed(other, data, step) != want


def test_either_reading_matches_when_the_store_did_not_say() -> None:
    data = os.urandom(10_000)
    whole = _b64(_raw("crc32", data))
    digest = Digest("crc32", whole, "base64", "here", parts=(6000, 4000), whole_too=True)
    assert _computed(digest, data, 999) == whole
    composite = _composite("crc32", data, (6000, 4000))
    digest = Digest("crc32", composite, "base64", "here", parts=(6000, 4000), whole_too=True)
    assert _computed(digest, data, 999) == composite
    # The last byte changed (a random one was b"x" once in 256 runs: a clean clone's CI).
    assert _computed(digest, data[:-1] + bytes([data[-1] ^ 1]), 999) != composite


def test_an_empty_object_in_one_empty_part_and_bytes_past_the_parts() -> None:
    empty = _composite("sha256", b"", (0,))
    assert _computed(Digest("sha256", empty, "base64", "here", parts=(0,)), b"", 1) == empty
    want = _composite("crc32", b"abcd", (2, 2))
    assert _computed(Digest("crc32", want, "base64", "here", parts=(2, 2)), b"abcde", 1) != want

"""The pure rules of remote reads, without a server: statuses, headers, redirects, retries."""

from __future__ import annotations

import email.utils

import pytest

from aioloader.errors import (
    AccessDeniedError,
    ConfigError,
    NotFoundError,
    ObjectChangedError,
    ReadError,
    ReadTimeoutError,
    SourceError,
)
from aioloader.settings.values import HttpOptions
from aioloader.sources.base import clip
from aioloader.sources.http.filler import Filler
from aioloader.sources.http.retry import Retrier, RetryableError, backoff_delay
from aioloader.sources.http.rules import (
    MAX_REDIRECTS,
    MAX_SMALL_READ,
    PROBE_SIZE,
    ContentRange,
    Verdict,
    check_encoding,
    check_same_etag,
    check_same_range,
    check_small_read,
    check_url,
    classify_status,
    failure,
    parse_content_range,
    parse_retry_after,
    pin_headers,
    redirect_target,
    same_origin,
    size_of,
    status_error,
    strong_etag,
    too_many_redirects,
)
from aioloader.sources.http.signer import HeaderSigner

URL = "https://example.com/model.safetensors"


def denied(url: str, status: int, detail: str) -> str:
    return f"denied {url} {status} {detail}"


# -- statuses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, Verdict.OK),
        (206, Verdict.OK),
        (429, Verdict.THROTTLED),
        (503, Verdict.THROTTLED),
        (408, Verdict.RETRY),
        (425, Verdict.RETRY),
        (500, Verdict.RETRY),
        (502, Verdict.RETRY),
        (504, Verdict.RETRY),
        (599, Verdict.RETRY),
        (412, Verdict.CHANGED),
        (301, Verdict.FAILED),
        (401, Verdict.FAILED),
        (403, Verdict.FAILED),
        (404, Verdict.FAILED),
        (416, Verdict.FAILED),
        (204, Verdict.FAILED),
    ],
)
def test_classify_status(status: int, verdict: Verdict) -> None:
    assert classify_status(status) is verdict


def test_status_error_throttled_carries_retry_after() -> None:
    error = status_error(URL, 429, {"Retry-After": "3"}, None)
    assert isinstance(error, RetryableError)
    assert error.throttled and error.retry_after == 3.0 and not error.timeout
    assert str(error) == "HTTP 429 (server is throttling)"
    error = status_error(URL, 503, {}, None)
    assert isinstance(error, RetryableError) and error.retry_after is None


def test_status_error_transient_and_changed() -> None:
    error = status_error(URL, 502, {}, None)
    assert isinstance(error, RetryableError) and not error.throttled
    assert str(error) == "HTTP 502"
    changed = status_error(URL, 412, {}, '"v1"')
    assert isinstance(changed, ObjectChangedError)
    assert f'{URL} changed on the server after the load started (version "v1" is gone)' in str(
        changed
    )


@pytest.mark.parametrize("status", [200, 206, 301, 401, 403, 404, 418])
def test_status_error_leaves_the_rest_to_failure(status: int) -> None:
    assert status_error(URL, status, {}, None) is None


def test_failure_messages() -> None:
    error = failure(URL, 403, "Forbidden", None, denied)
    assert isinstance(error, AccessDeniedError)
    assert str(error) == f"denied {URL} 403 Forbidden"
    error = failure(URL, 404, "Not Found", None, denied)
    assert isinstance(error, NotFoundError)
    assert str(error) == f"{URL} does not exist (HTTP 404 Not Found); check the URL"
    error = failure(URL, 302, "Found", "https://elsewhere/x", denied)
    assert type(error) is SourceError
    assert "HTTP 302 Found redirect to https://elsewhere/x was not followed" in str(error)
    error = failure(URL, 418, "teapot", None, denied)
    assert str(error) == f"{URL}: unexpected HTTP 418 teapot"


# -- headers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("bytes 0-9/100", ContentRange(0, 9, 100)),
        ("bytes 5-5/*", ContentRange(5, 5, None)),
        ("bytes */100", None),
        ("items 0-9/100", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_content_range(value: str | None, parsed: ContentRange | None) -> None:
    assert parse_content_range(value) == parsed


def test_parse_retry_after() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("") is None
    assert parse_retry_after("2.5") == 2.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("soon") is None
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == pytest.approx(30.0)
    assert parse_retry_after(date, now=2_000_000) == 0.0


def test_strong_etag_and_pin_headers() -> None:
    assert strong_etag('"abc"') == '"abc"'
    assert strong_etag('W/"abc"') is None
    assert strong_etag(None) is None and strong_etag("") is None
    assert pin_headers('"abc"', "Mon, 01 Jan 2024 00:00:00 GMT") == {"If-Match": '"abc"'}
    date = "Mon, 01 Jan 2024 00:00:00 GMT"
    assert pin_headers(None, date) == {"If-Unmodified-Since": date}
    assert pin_headers(None, None) == {}


@pytest.mark.parametrize("encoding", [None, "", "identity", " Identity "])
def test_check_encoding_accepts_identity(encoding: str | None) -> None:
    check_encoding(URL, {} if encoding is None else {"Content-Encoding": encoding})


def test_check_encoding_refuses_compression() -> None:
    with pytest.raises(RetryableError, match="Content-Encoding: gzip although only identity"):
        check_encoding(URL, {"Content-Encoding": "GZIP"})


def test_size_of() -> None:
    assert size_of(URL, 206, {"Content-Range": "bytes 0-9/1000"}) == (1000, True)
    assert size_of(URL, 200, {"Content-Length": "10"}) == (10, True)
    assert size_of(URL, 200, {"Content-Length": str(PROBE_SIZE + 1)}) == (PROBE_SIZE + 1, False)
    with pytest.raises(SourceError, match="Content-Range does not give the file size"):
        size_of(URL, 206, {"Content-Range": "bytes 0-9/*"})
    with pytest.raises(SourceError, match="neither honours Range nor sends Content-Length"):
        size_of(URL, 200, {})


def test_check_same_range() -> None:
    ok = {"Content-Range": "bytes 10-19/100", "ETag": '"v1"'}
    check_same_range(URL, 100, '"v1"', 206, ok, 10)
    check_same_range(URL, 100, '"v1"', 206, {"Content-Range": "bytes 10-19/*"}, 10)
    check_same_range(URL, 100, '"v1"', 206, {**ok, "ETag": 'W/"v2"'}, 10)  # weak: not compared
    check_same_range(URL, 100, None, 206, {**ok, "ETag": '"v2"'}, 10)  # nothing pinned
    cases = [
        (200, ok, 10, "the server stopped honouring Range"),
        (206, ok, 0, "the server answered a different range (bytes 10-19/100)"),
        (206, {}, 10, "the server answered a different range (None)"),
        (206, {"Content-Range": "bytes 10-19/99"}, 10, "its size changed from 100 to 99 bytes"),
        (206, {**ok, "ETag": '"v2"'}, 10, 'its ETag changed from "v1" to "v2"'),
    ]
    for status, headers, start, why in cases:
        with pytest.raises(ObjectChangedError) as info:
            check_same_range(URL, 100, '"v1"', status, headers, start)
        assert str(info.value) == (
            f"{URL} changed during the load: {why}; tensors from two versions must not be "
            "mixed: load again"
        )


def test_check_same_etag() -> None:
    check_same_etag(URL, '"v1"', {"ETag": '"v1"'})
    check_same_etag(URL, '"v1"', {})
    check_same_etag(URL, None, {"ETag": '"v2"'})
    with pytest.raises(ObjectChangedError, match='ETag changed from "v1" to "v2"; load again'):
        check_same_etag(URL, '"v1"', {"ETag": '"v2"'})


# -- redirects and origins -----------------------------------------------------------------


def test_same_origin() -> None:
    assert same_origin("https://a.example/x", "https://a.example/y?z")
    assert not same_origin("https://a.example/x", "http://a.example/x")
    assert not same_origin("https://a.example/x", "https://b.example/x")
    assert not same_origin("https://a.example/x", "https://a.example:8443/x")


def test_redirect_target() -> None:
    assert redirect_target(URL, "https://a.example/d/f", "g") == "https://a.example/d/g"
    assert redirect_target(URL, "https://a.example/f", "http://b.example/f") == (
        "http://b.example/f"
    )
    with pytest.raises(SourceError) as info:
        redirect_target(URL, "https://a.example/f", "ftp://b.example/f")
    assert str(info.value) == (
        f"{URL}: the server redirected to ftp://b.example/f, a ftp: URL; only http:// and "
        "https:// redirects are followed: use the final URL"
    )
    error = too_many_redirects(URL, "https://a.example/loop")
    assert str(error) == (
        f"{URL}: more than {MAX_REDIRECTS} redirects (last to https://a.example/loop); "
        "use the final URL"
    )


async def test_header_signer_keeps_headers_at_home() -> None:
    signer = HeaderSigner((("Authorization", "Bearer t"), ("X-Key", "k")))
    home = await signer.sign("GET", URL, {"X-Key": "mine"}, origin=URL)
    assert home == {"Authorization": "Bearer t", "X-Key": "mine"}
    for away in ("https://cdn.example/f", "http://example.com/model.safetensors"):
        assert await signer.sign("GET", away, {"Range": "bytes=0-1"}, origin=URL) == {
            "Range": "bytes=0-1"
        }
    assert "with the configured headers" in signer.describe_denied(URL, 401, "")
    assert "without credentials" in HeaderSigner(()).describe_denied(URL, 401, "")


# -- buffers ----------------------------------------------------------------------------


def test_filler_spans_buffers_and_refuses_overflow() -> None:
    first, second = bytearray(3), bytearray(4)
    filler = Filler([memoryview(first), memoryview(second)])
    assert filler.total == 7
    filler.write(b"ab")
    filler.write(b"cde")
    filler.current()[:1] = b"f"
    filler.advance(1)
    assert (bytes(first), bytes(second[:3]), filler.remaining) == (b"abc", b"def", 1)
    with pytest.raises(RetryableError, match="server sent 1 bytes more than asked"):
        filler.write(b"gh")


def test_clip() -> None:
    views = [memoryview(bytearray(4)), memoryview(bytearray(4)), memoryview(bytearray(4))]
    assert [v.nbytes for v in clip(views, 6)] == [4, 2]
    assert clip(views, 0) == []
    assert [v.nbytes for v in clip(views, 100)] == [4, 4, 4]


# -- retries ----------------------------------------------------------------------------


def test_backoff_delay() -> None:
    options = HttpOptions(backoff=1.0, backoff_max=5.0)

    def top(low: float, high: float) -> float:
        return high

    assert [backoff_delay(options, n, False, None, top) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    assert backoff_delay(options, 3, False, None, lambda low, high: low) == 2.0
    assert backoff_delay(options, 3, True, None, top) == 0.0  # progress: at once
    assert backoff_delay(options, 1, True, 3.0, top) == 3.0  # but Retry-After holds
    assert backoff_delay(options, 1, False, 60.0, top) == 5.0  # capped


async def test_retrier_counts_only_attempts_without_progress() -> None:
    retrier = Retrier(2, HttpOptions(max_attempts=2, backoff=0.0))
    done = 0

    async def trickle() -> str:
        nonlocal done
        done += 1
        if done < 5:
            raise RetryableError("dropped")
        return "finished"

    assert await retrier.run(URL, 0, 10, trickle, lambda: done) == "finished"
    assert retrier.statistics().in_flight == 0


async def test_retrier_gives_up_with_the_last_failure() -> None:
    retrier = Retrier(2, HttpOptions(max_attempts=3, backoff=0.0))

    async def fail() -> None:
        raise RetryableError("HTTP 502")

    with pytest.raises(ReadError) as info:
        await retrier.run(URL, 0, 10, fail)
    assert type(info.value) is ReadError
    assert f"{URL} bytes [0, 10) failed after 3 attempts, 3 of them without progress " in str(
        info.value
    )
    assert "(last: HTTP 502)" in str(info.value)

    async def stall() -> None:
        raise RetryableError("no data", timeout=True)

    with pytest.raises(ReadTimeoutError):
        await retrier.run(URL, 0, 10, stall)


async def test_retrier_throttling_lowers_the_limit() -> None:
    retrier = Retrier(4, HttpOptions(max_attempts=2, backoff=0.0))
    calls = 0

    async def throttled_once() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RetryableError("HTTP 429", throttled=True, retry_after=0.0)
        return calls

    assert await retrier.run(URL, 0, 10, throttled_once) == 2
    stats = retrier.statistics()
    assert (stats.limit, stats.throttled) == (2, 1)


@pytest.mark.parametrize(
    "url",
    [
        "https://h:99999/m?X-Amz-Signature=s3cret",
        "https://h:0/m?sig=s3cret",
        "https://h:-1/m?sig=s3cret",
        "https://h:1a/m?sig=s3cret",
        "https://[::1]:70000/m?sig=s3cret",
        "https://:443/m?sig=s3cret",
        "https:///m?sig=s3cret",
    ],
)
def test_urls_no_request_can_go_to_are_named_without_their_secrets(url: str) -> None:
    with pytest.raises(ConfigError, match="cannot be requested") as asked:
        check_url(url, url)
    with pytest.raises(SourceError, match="https://ok/m") as elsewhere:
        check_url("https://ok/m", url)
    assert not isinstance(elsewhere.value, ConfigError)
    for error in (asked.value, elsewhere.value):
        assert "s3cret" not in str(error) and "REDACTED" in str(error)


@pytest.mark.parametrize(
    "url", ["https://h/m", "http://h:1/m", "https://h:65535/m?sig=x", "http://[::1]:8080/m"]
)
def test_urls_a_request_can_go_to_pass(url: str) -> None:
    check_url(url, url)


def test_small_reads_beyond_any_header_are_refused() -> None:
    check_small_read("u", 1 << 40, 0, MAX_SMALL_READ)
    with pytest.raises(SourceError, match=r"u: reading bytes \[8, 1099511627784\)"):
        check_small_read("u", 1 << 40, 8, 1 << 40)

"""Secrets in URLs never reach an error message, a log line or a load report."""

from __future__ import annotations

import importlib
import io
import logging
import pkgutil
from pathlib import Path

import pytest

import aioloader
from aioloader.redact import REDACTED, RedactingFilter, redact, redacting_logger

from .helpers import random_tensors, write_file
from .servers import FaultyHttpServer

SIGNED = (
    "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIASECRET%2F20240101%2Fus-east-1"
    "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    "&X-Amz-Security-Token=SECRETTOKEN&X-Amz-Signature=SECRETSIG"
)
SIGNED_SHOWN = (
    "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=REDACTED"
    "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    "&X-Amz-Security-Token=REDACTED&X-Amz-Signature=REDACTED"
)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"https://b.s3.amazonaws.com/m.safetensors{SIGNED}", f"https://b.s3.amazonaws.com/m.safetensors{SIGNED_SHOWN}"),
        # Azure SAS: every parameter but none of its values.
        (
            "https://a.blob.core.windows.net/c/m?sv=2022-11-02&sp=r&se=2024-01-01T00:00Z&sig=SECRET%3D",
            "https://a.blob.core.windows.net/c/m?sv=REDACTED&sp=REDACTED&se=REDACTED&sig=REDACTED",
        ),
        ("https://h/m?token=SECRET&download=true", "https://h/m?token=REDACTED&download=true"),
        ("https://h/m?ACCESS_TOKEN=SECRET", "https://h/m?ACCESS_TOKEN=REDACTED"),
        ("https://h/m?Signature=S&Key-Pair-Id=K&Policy=P", "https://h/m?Signature=REDACTED&Key-Pair-Id=REDACTED&Policy=REDACTED"),
        ("https://h/m?versionId=3&x-id=GetObject", "https://h/m?versionId=3&x-id=GetObject"),
        ("https://h/cb#access_token=SECRET&state=s", "https://h/cb#access_token=REDACTED&state=REDACTED"),
        # User info: user names are often tokens too.
        ("https://user:SECRET@h/m", "https://REDACTED@h/m"),
        ("https://ghp_SECRET@github.com/o/r", "https://REDACTED@github.com/o/r"),
        ("s3://key:SECRET@bucket/m/", "s3://REDACTED@bucket/m/"),
        # In running text: punctuation, quotes and brackets stay.
        (
            "https://h/m?sig=SECRET: HTTP 403 Forbidden",
            "https://h/m?sig=REDACTED: HTTP 403 Forbidden",
        ),
        ("url='https://h/m?sig=SECRET' (and more).", "url='https://h/m?sig=REDACTED' (and more)."),
        ("(see https://h/m?sig=SECRET)", "(see https://h/m?sig=REDACTED)"),
        ("two: https://h/a?sig=S1 and https://u:p@h/b?t=S2", "two: https://h/a?sig=REDACTED and https://REDACTED@h/b?t=REDACTED"),
        # Relative redirect targets carry their query too.
        ("redirected to /m.safetensors?sig=SECRET", "redirected to /m.safetensors?sig=REDACTED"),
        # Nothing to hide: unchanged.
        ("https://h/m.safetensors", "https://h/m.safetensors"),
        ("https://h/m?...", "https://h/m?..."),
        ("https://h/m?flag&empty=", "https://h/m?flag&empty="),
        ("a = b & c=d, user@example.com", "a = b & c=d, user@example.com"),
    ],
)  # fmt: skip
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert redact(shown) == shown  # idempotent


def test_error_messages_are_redacted_when_made() -> None:
    url = f"https://user:PASSWORD@h/m.safetensors{SIGNED}"
    for kind in (aioloader.LoaderError, aioloader.NotFoundError, aioloader.SelectionError):
        error = kind(f"{url} does not exist")
        assert "SECRET" not in str(error) and "PASSWORD" not in str(error)
        assert f"https://{REDACTED}@h/m.safetensors{SIGNED_SHOWN}" in str(error)
    read = aioloader.ReadError(f"{url} failed", url=url, start=0, end=1)
    assert "SECRET" not in str(read) and read.url == url  # the attribute is for programs


async def test_errors_of_a_real_load_are_redacted(http_server: FaultyHttpServer) -> None:
    url = http_server.url_for("missing.safetensors") + SIGNED
    with pytest.raises(aioloader.NotFoundError) as info:
        await aioloader.load_model(url)
    assert "missing.safetensors" in str(info.value) and "SECRET" not in str(info.value)


async def test_log_records_are_redacted(
    http_server: FaultyHttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    write_file(http_server.root / "m.safetensors", random_tensors(1))
    http_server.status("m.safetensors", 503)  # one retry, logged with the URL
    caplog.set_level(logging.INFO, logger="aioloader")
    url = http_server.url_for("m.safetensors") + SIGNED
    opts = aioloader.HttpOptions(backoff=0.01)
    async with aioloader.Loader(http=opts) as loader:
        await loader.load(url)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("aioloader")]
    assert any("X-Amz-Signature=REDACTED" in m for m in messages), messages
    assert "SECRET" not in caplog.text


def test_the_filter_redacts_message_arguments_and_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = redacting_logger("aioloader.tests.child")
    assert redacting_logger("aioloader.tests.child") is logger
    assert logger.filters.count(logger.filters[0]) == 1  # attached once
    caplog.set_level(logging.INFO, logger="aioloader")
    try:
        raise OSError("cannot reach https://h/m?sig=SECRET")
    except OSError:
        logger.exception("fetching %s failed", "https://u:SECRET@h/m")
    logging.getLogger("aioloader").info("%s", "https://h/m?token=SECRET")
    assert "SECRET" not in caplog.text, caplog.text
    assert "https://REDACTED@h/m" in caplog.text and "sig=REDACTED" in caplog.text
    # A record without secrets keeps its arguments for structured handlers.
    record = logging.LogRecord("aioloader", logging.INFO, __file__, 1, "n=%d", (3,), None)
    assert RedactingFilter().filter(record) and record.args == (3,)


def _module_loggers() -> list[logging.Logger]:
    """The module-level ``logger`` of every aioloader module that imports here."""
    found = []
    for info in pkgutil.walk_packages(aioloader.__path__, "aioloader."):
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra (ray) is not installed
            continue
        logger = getattr(module, "logger", None)
        if isinstance(logger, logging.Logger):
            found.append(logger)
    return found


def test_every_module_logger_redacts() -> None:
    # A filter on a logger does not see its children's records: each module logger
    # other than the package's own must carry the filter itself (redacting_logger).
    loggers = _module_loggers()
    assert any(logger.name.startswith("aioloader.") for logger in loggers)
    for logger in loggers:
        assert any(isinstance(f, RedactingFilter) for f in logger.filters), logger.name


@pytest.mark.parametrize(
    "name", ["aioloader.daemon.app", "aioloader.daemon.server", "aioloader.vllm"]
)
def test_a_child_logger_is_redacted_where_a_handler_prints(name: str) -> None:
    logger = importlib.import_module(name).logger
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    # The handler of an application that configured logging: on the root, no filter.
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        try:
            raise OSError("cannot reach https://h/m?sig=SECRET")
        except OSError:
            logger.error("fetching %s failed", "https://u:SECRET@h/m", exc_info=True)
    finally:
        root.removeHandler(handler)
    text = stream.getvalue()
    assert f"{logger.name}: fetching https://REDACTED@h/m failed" in text, text
    assert "sig=REDACTED" in text and "SECRET" not in text, text


async def test_load_report_summary_is_redacted(
    http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    write_file(http_server.root / "m.safetensors", random_tensors(2))
    url = http_server.url_for("m.safetensors") + SIGNED
    async with aioloader.Loader() as loader, loader.stream(url) as stream:
        async for _ in stream:
            pass
    report = stream.report
    assert report is not None
    assert "SECRET" not in report.summary() and "SECRET" not in repr(report.as_dict())
    assert report.url == http_server.url_for("m.safetensors") + SIGNED_SHOWN
    made = aioloader.LoadReport(
        url="https://u:p@h/m?sig=S", device="cpu", files=1, tensors=1, bytes=1,
        header_seconds=0, read_seconds=0, copy_seconds=0, total_seconds=0, peak_staging_bytes=0,
    )  # fmt: skip
    assert made.url == "https://REDACTED@h/m?sig=REDACTED"

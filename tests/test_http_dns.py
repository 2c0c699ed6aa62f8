"""A host name that does not resolve fails at once; a resolver that says "try again" is retried."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

import aioloader
from aioloader import SourceError

from .helpers import assert_same, random_tensors, write_file


async def test_unknown_host_fails_at_once_naming_it() -> None:
    url = "http://no-such-host.invalid/model.safetensors"
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        # Six attempts with seconds of backoff between them, were it retried.
        await aioloader.load_model(url, max_attempts=6, backoff=2.0, cache_dir=False)
    assert time.monotonic() - started < 2.0
    message = str(caught.value)
    assert "'no-such-host.invalid' does not resolve" in message and url in message
    assert "attempts" not in message
    assert not isinstance(caught.value, aioloader.NotFoundError)


async def test_try_again_from_the_resolver_is_retried(
    tmp_path: Path, http_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = random_tensors(count=3)
    write_file(http_server.root / "m.safetensors", tensors)
    real = socket.getaddrinfo
    refusals = [0]

    def flaky(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "flaky.test":
            if refusals[0] < 2:
                refusals[0] += 1
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", flaky)
    url = f"http://flaky.test:{http_server.port}/m.safetensors"
    got = await aioloader.load_model(url, backoff=0.05, cache_dir=False)
    assert refusals[0] == 2
    assert_same(got, tensors)

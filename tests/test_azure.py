"""Azure Blob Storage against Azurite on 127.0.0.1 (see tests/azure_server.py).

``az://container/path`` with the account from ``AZURE_STORAGE_CONNECTION_STRING``
(its key becomes a read-only SAS through azure-storage-blob), a SAS token given
in the environment, and a bad key; every tensor compared bit for bit.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from aioloader import AccessDeniedError, ModelCache, NotFoundError, load_model

from .azure_server import AZURITE, KEY, AzuriteServer
from .helpers import assert_matches_files, random_tensors, some_big, write_file, write_sharded

pytest.importorskip("azure.storage.blob")
pytestmark = pytest.mark.skipif(
    not AZURITE.exists(), reason="no Azurite (run scripts/azurite_setup.sh)"
)


async def test_a_prefix_an_index_and_one_blob_load_bit_for_bit(
    account: AzuriteServer, tmp_path: Path
) -> None:
    index = write_sharded(tmp_path / "m", some_big(1), shards=3)
    shards = sorted(index.parent.glob("*.safetensors"))
    account.upload("models", "llm", tmp_path / "m")
    assert_matches_files(await load_model("az://models/llm/", chunk_size="256KiB"), *shards)
    got = await load_model("az://models/llm/model.safetensors.index.json", concurrency=3)
    assert_matches_files(got, *shards)


async def test_a_sas_token_from_the_environment(
    account: AzuriteServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    path = write_file(tmp_path / "one" / "model.safetensors", some_big(2))
    account.upload("sas", "one", tmp_path / "one")
    token = generate_container_sas(
        "devstoreaccount1", "sas", account_key=KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=30),
    )  # fmt: skip
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", token)
    assert_matches_files(await load_model("az://sas/one/"), path)


async def test_a_wrong_key_is_refused_naming_the_credentials_without_the_secret(
    account: AzuriteServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_file(tmp_path / "m" / "model.safetensors", random_tensors())
    account.upload("locked", "m", tmp_path / "m")
    wrong = "A" * 86 + "=="
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING", account.connection_string.replace(KEY, wrong)
    )
    with pytest.raises(AccessDeniedError) as info:
        await load_model("az://locked/m/model.safetensors")
    message = str(info.value)
    assert (
        "account key of devstoreaccount1" in message
        and "AZURE_STORAGE_CONNECTION_STRING" in message
    )
    assert wrong not in message and "sig=" not in message.replace("sig=REDACTED", "")


async def test_missing_blob_and_container_are_named(account: AzuriteServer, tmp_path: Path) -> None:
    write_file(tmp_path / "m" / "model.safetensors", random_tensors())
    account.upload("present", "m", tmp_path / "m")
    with pytest.raises(NotFoundError, match=r"az://present/m/none\.safetensors does not exist"):
        await load_model("az://present/m/none.safetensors")
    with pytest.raises(NotFoundError, match="'absent'"):
        await load_model("az://absent/m/")


async def test_through_the_node_cache_and_a_new_version(
    account: AzuriteServer, tmp_path: Path
) -> None:
    path = write_file(tmp_path / "m" / "model.safetensors", some_big(3))
    account.upload("cached", "m", tmp_path / "m")
    url = "az://cached/m/model.safetensors"
    root = tmp_path / "cache"
    assert_matches_files(await load_model(url, cache_dir=root), path)
    cache = ModelCache(root)
    await cache.wait_committed()
    assert (await cache.fetch(url)).hit
    newer = write_file(tmp_path / "n" / "model.safetensors", some_big(4))
    account.upload("cached", "m", tmp_path / "n")  # a new ETag
    assert not (await cache.fetch(url)).hit
    assert_matches_files(await load_model(url, cache_dir=root), newer)


async def test_throttling_and_dropped_connections_are_retried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Azure's path layout served by the fault-injecting HTTP server: 503 and cut bodies.

    Azurite cannot be told to misbehave; the same requests (path-style endpoint,
    SAS query, x-ms-version) go to a server that can, and the load still matches.
    """
    from .servers import FaultyHttpServer

    www = tmp_path / "www"
    path = write_file(www / "devstoreaccount1" / "models" / "m" / "model.safetensors", some_big(5))
    with FaultyHttpServer(www) as server:
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING",
            f"AccountName=devstoreaccount1;BlobEndpoint={server.url}/devstoreaccount1",
        )
        for name in ("AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "sv=2021-08-06&sig=secret")
        rel = "devstoreaccount1/models/m/model.safetensors"
        server.stall(rel, 0.0)  # the probe goes through
        server.status(rel, 503, count=3, retry_after=0.05)
        server.reset_after(rel, 100_000, count=2)
        from aioloader import HttpOptions

        got = await load_model(
            "az://models/m/model.safetensors",
            chunk_size="256KiB",
            http=HttpOptions(backoff=0.01, backoff_max=0.05),
        )
        assert_matches_files(got, path)
        reads = -(-path.stat().st_size // (256 << 10))
        # The probe (which also holds the first chunk), the other reads, 3 answers of 503
        # and 2 cut bodies, each tried again.
        assert len(server.gets()) >= 1 + (reads - 1) + 3 + 2
        assert all(h.get("x-ms-version") for h in server.request_headers)


async def test_an_account_key_from_the_environment(
    account: AzuriteServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_KEY)."""
    path = write_file(tmp_path / "k" / "model.safetensors", some_big(6))
    account.upload("keyed", "k", tmp_path / "k")
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        f"AccountName=devstoreaccount1;BlobEndpoint={account.endpoint}",
    )
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
    assert_matches_files(await load_model("az://keyed/k/model.safetensors"), path)


def test_urls_of_an_account_name_the_account_endpoint_and_sas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aioloader.runtime.threads import Lanes
    from aioloader.sources.auto import source_for
    from aioloader.sources.azure.source import AzureSource
    from aioloader.sources.azure.url import AzureBlobAddress, is_azure_url

    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    url = "https://acct.blob.core.windows.net/box/llm/model.safetensors?sv=1&sig=abc%2B"
    assert is_azure_url(url) and is_azure_url("az://box/x") and not is_azure_url("https://x.y/z")
    with Lanes(2) as lanes:
        assert isinstance(source_for(url, lanes=lanes), AzureSource)
    where = AzureBlobAddress(url)
    assert (where.account, where.container, where.name) == ("acct", "box", "llm/model.safetensors")
    assert where.endpoint == "https://acct.blob.core.windows.net" and where.url_sas.endswith("%2B")
    with pytest.raises(Exception, match="AZURE_STORAGE_CONNECTION_STRING"):
        AzureBlobAddress("az://box/llm/")  # no account anywhere
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "other")
    assert AzureBlobAddress("az://box/llm/").endpoint == "https://other.blob.core.windows.net"

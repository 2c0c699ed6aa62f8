"""``az://`` blobs checked against the Content-MD5 Azure keeps for them, where it does.

Found with Azurite 3.35 (as Azure documents it): a blob written by one Put Blob
(``upload_blob`` under ``max_single_put_size``) has a Content-MD5 the service computed;
one written in blocks (``upload_blob`` above it, ``stage_block`` + ``commit_block_list``)
has none, unless the client sets one. A load checks the MD5 where there is one and
reads the blob as it is where there is none.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from aioloader import DigestMismatchError, load_model

from .azure_server import AZURITE, AzuriteServer
from .helpers import assert_matches_files, write_file

pytest.importorskip("azure.storage.blob")
pytestmark = pytest.mark.skipif(
    not AZURITE.exists(), reason="no Azurite (run scripts/azurite_setup.sh)"
)

BLOCK = 1 << 20


def _container(azurite: AzuriteServer, name: str) -> Any:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(
        azurite.connection_string, max_single_put_size=BLOCK, max_block_size=BLOCK
    )
    box = service.get_container_client(name)
    if not box.exists():
        box.create_container()
    return box


def _model(tmp_path: Path, seed: int, numel: int) -> Path:
    gen = torch.Generator().manual_seed(seed)
    tensors = {"w": torch.randn(numel, generator=gen), "i": torch.arange(33, dtype=torch.int32)}
    return write_file(tmp_path / f"model-{seed}.safetensors", tensors)


def _md5(data: bytes) -> bytearray:
    return bytearray(hashlib.md5(data).digest())


def _set_md5(box: Any, name: str, md5: bytearray) -> None:
    from azure.storage.blob import ContentSettings

    box.get_blob_client(name).set_http_headers(ContentSettings(content_md5=md5))


async def test_a_single_put_blob_is_checked_against_its_content_md5(
    account: AzuriteServer, tmp_path: Path
) -> None:
    path = _model(tmp_path, 1, 100_000)  # 400 KB: one Put Blob
    data = path.read_bytes()
    box = _container(account, "single")
    box.upload_blob("m/model.safetensors", data, overwrite=True)
    props = box.get_blob_client("m/model.safetensors").get_blob_properties()
    assert bytes(props.content_settings.content_md5) == hashlib.md5(data).digest()
    url = "az://single/m/model.safetensors"
    assert_matches_files(await load_model(url, chunk_size="64KiB"), path)

    # The stored bytes change, the MD5 Azure keeps for the blob stays.
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    box.upload_blob("m/model.safetensors", bytes(bad), overwrite=True)
    _set_md5(box, "m/model.safetensors", _md5(data))
    with pytest.raises(DigestMismatchError) as info:
        await load_model(url, chunk_size="64KiB")
    want = base64.b64encode(hashlib.md5(data).digest()).decode()
    assert info.value.algorithm == "md5" and info.value.expected == want
    assert info.value.url == url and "Content-MD5" in str(info.value)


@pytest.mark.parametrize("how", ["upload_blob", "stage_block"])
async def test_a_blob_written_in_blocks_has_no_md5_and_loads(
    account: AzuriteServer, tmp_path: Path, how: str
) -> None:
    path = _model(tmp_path, 2, 800_000)  # 3.2 MB: four blocks
    data = path.read_bytes()
    box = _container(account, "blocks")
    name = f"{how}/model.safetensors"
    if how == "upload_blob":
        box.upload_blob(name, data, overwrite=True)
    else:
        from azure.storage.blob import BlobBlock

        blob = box.get_blob_client(name)
        ids = []
        for i, at in enumerate(range(0, len(data), BLOCK)):
            ids.append(base64.b64encode(b"%05d" % i).decode())
            blob.stage_block(ids[-1], data[at : at + BLOCK])
        blob.commit_block_list([BlobBlock(i) for i in ids])
    props = box.get_blob_client(name).get_blob_properties()
    assert props.content_settings.content_md5 is None
    url = f"az://blocks/{name}"
    assert_matches_files(await load_model(url, chunk_size="256KiB"), path)

    # An MD5 the client set for the whole blob is checked like the service's.
    _set_md5(box, name, _md5(data[:-1] + b"x"))
    with pytest.raises(DigestMismatchError):
        await load_model(url, chunk_size="256KiB")
    _set_md5(box, name, _md5(data))
    assert_matches_files(await load_model(url, chunk_size="256KiB"), path)


async def test_az_names_with_a_hash_or_a_question_mark(
    account: AzuriteServer, tmp_path: Path
) -> None:
    """``az://c/dir#x/model.safetensors`` names that blob, not the decoy ``dir``."""
    real = write_file(tmp_path / "real.safetensors", {"real": torch.arange(1000.0)})
    decoy = write_file(tmp_path / "decoy.safetensors", {"decoy": torch.zeros(10)})
    box = _container(account, "keys")
    for name, trap in (("dir#x/model.safetensors", "dir"), ("a?b.safetensors", "a")):
        box.upload_blob(name, real.read_bytes(), overwrite=True)
        box.upload_blob(trap, decoy.read_bytes(), overwrite=True)
        assert_matches_files(await load_model(f"az://keys/{name}"), real)
    assert_matches_files(await load_model("az://keys/dir#x/"), real)

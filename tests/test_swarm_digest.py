"""A swarm copy is checked against the digest its publisher gives before the cache
commits it: the Hub's blob id (LFS sha256, git blob sha1) of an hf:// file, S3's
full-object checksum of an s3:// object.

A peer that serves wrong bytes under a valid torrent is made for real: node 0 pulls the
model from the origin, stops, its committed entry of one shard is rewritten (bytes and
the checksum its meta records, so the cache's own check passes), and it starts again
and seeds that copy: libtorrent's piece hashes, made from the bad bytes, all pass. Only
the publisher's digest tells. Node 1 must refuse the copy before commit, fall back to the
origin, and end bit-identical.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .fleet import Fleet, swarm_missing
from .helpers import some_big, write_sharded

_MISSING = swarm_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"needs the swarm: {_MISSING}")
pytest.importorskip("prometheus_client")

ARGS = ["--swarm-wait", "1", "--swarm-stall", "10"]


def _entries(cache: Path) -> dict[str, Path]:
    """URL -> data of every complete entry of a node's cache."""
    found = {}
    for meta in cache.glob("entries/*/meta.json"):
        doc = json.loads(meta.read_text())
        if doc.get("complete"):
            found[doc["url"]] = meta.parent / "data"
    return found


def _forge(cache: Path, name: str) -> bytes:
    """Flip bytes of the committed entry of the file ``name`` (its tensor data) and record
    the checksum of the new bytes in its meta, as if they had been fetched so; returns
    the forged bytes."""
    from aioloader.cache.checksum import hash_file

    (data,) = [p for u, p in _entries(cache).items() if u.endswith("/" + name)]
    raw = bytearray(data.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")
    for at in range(start, len(raw), 4096):
        raw[at] ^= 0xFF
    data.chmod(0o644)
    data.write_bytes(bytes(raw))
    meta = data.parent / "meta.json"
    doc = json.loads(meta.read_text())
    doc["checksum"] = hash_file(data)
    meta.write_text(json.dumps(doc, sort_keys=True))
    return bytes(raw)


def _assert_same(cache: Path, files: dict[str, bytes]) -> None:
    held = {u.rsplit("/", 1)[1]: p for u, p in _entries(cache).items()}
    for name, data in files.items():
        if name.endswith((".safetensors", ".index.json")):
            assert held[name].read_bytes() == data, f"{name}: the node's copy differs"


def _refused_then_origin(fleet: Fleet, url: str, files: dict[str, bytes], shard: str) -> str:
    """Nodes 0 then 1 as the module says; node 1's log."""
    fleet.start(0)
    fleet.post(0, url, "m")
    fleet.wait_ready(0, "m", seconds=90)
    assert fleet.stop(0) == 0
    forged = _forge(fleet[0].cache_dir, shard)
    assert forged != files[shard]
    fleet.start(0)
    fleet.post(0, url, "m")  # a cache hit; its check passes; the node seeds what it holds
    fleet.wait_ready(0, "m", seconds=90)
    fleet.start(1)
    fleet.post(1, url, "m")
    record = fleet.wait_ready(1, "m", seconds=120)
    _assert_same(fleet[1].cache_dir, files)
    # Node 0 was followed (the other files came from it), the forged shard was not taken.
    assert record["bytes_from_peers"] > 0
    assert record["bytes_from_origin"] >= len(files[shard])
    return fleet[1].output()


# -- hf:// against a local Hub --------------------------------------------------------


@pytest.fixture
def hub_env(tmp_path: Path) -> Iterator[tuple[Any, dict[str, str]]]:
    pytest.importorskip("huggingface_hub")
    from .hub_server import LocalHub

    with LocalHub(tmp_path) as hub:
        home = tmp_path / "hf-home"
        home.mkdir()
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_TOKEN_PATH": str(home / "x")}
        yield hub, env


def test_an_hf_swarm_copy_that_differs_from_the_hubs_sha256_is_refused(
    tmp_path: Path, hub_env: tuple[Any, dict[str, str]]
) -> None:
    hub, env = hub_env
    folder = tmp_path / "src"
    write_sharded(folder, some_big(5), shards=2)
    (folder / "config.json").write_text('{"model_type": "test"}')
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    hub.commit("org/forged", files)
    shard = "model-00001-of-00002.safetensors"
    with Fleet(2, tmp_path / "fleet", swarm=True, args=ARGS, env=env) as fleet:
        log = _refused_then_origin(fleet, "hf://org/forged", files, shard)
    assert f"{shard}: the copy from" in log and "does not match the sha256" in log, log[-3000:]
    assert "LFS oid" in log


# -- s3:// with a full-object checksum ----------------------------------------------------


def _put(s3: Any, bucket: str, key: str, data: bytes, algorithm: str) -> None:
    client = s3.client()
    if algorithm != "CRC32C":
        client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm=algorithm)
        return
    # botocore computes CRC32C only with awscrt: set it as S3 keeps it (tests/test_digest.py).
    crc32c = pytest.importorskip("google_crc32c")
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    client.put_object(Bucket=bucket, Key=key, Body=data)
    stored = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, key)
    stored.checksum_algorithm = "CRC32C"
    stored.checksum_value = base64.b64encode(crc32c.value(data).to_bytes(4, "big")).decode()


@pytest.mark.parametrize("algorithm", ["SHA256", "CRC32C"])
def test_an_s3_swarm_copy_that_differs_from_the_full_object_checksum_is_refused(
    tmp_path: Path, s3_env: Any, algorithm: str
) -> None:
    folder = tmp_path / "src"
    write_sharded(folder, some_big(6), shards=2)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    bucket = f"swarm-digest-{algorithm.lower()}"
    s3_env.client().create_bucket(Bucket=bucket)
    for name, data in files.items():
        _put(s3_env, bucket, f"m/{name}", data, algorithm)
    url = f"s3://{bucket}/m/model.safetensors.index.json"
    shard = "model-00002-of-00002.safetensors"
    with Fleet(2, tmp_path / "fleet", swarm=True, args=ARGS) as fleet:
        log = _refused_then_origin(fleet, url, files, shard)
    header = f"x-amz-checksum-{algorithm.lower()}"
    assert shard in log and header in log, log[-3000:]


def test_a_file_assembled_from_ranges_is_checked_against_the_hubs_sha256(
    tmp_path: Path, hub_env: tuple[Any, dict[str, str]]
) -> None:
    """Three nodes split an 80 MiB one-file model of the Hub in byte ranges. Its storage
    host first serves bytes of the right size that differ from the file's LFS oid: each
    node assembles the file from its ranges and its peers', the whole file's sha256
    differs, and no cache keeps any of it. Served true again, a fetch assembles it on
    every node, bit-identical."""
    import hashlib

    from .daemon_helpers import single_file

    hub, env = hub_env
    data = single_file(tmp_path / "src" / "model.safetensors", kib=80 * 1024).read_bytes()
    hub.commit("org/ranged", {"model.safetensors": data, "config.json": b'{"model_type": "x"}'})
    blob = hub.storage.root / hashlib.sha256(data).hexdigest()
    forged = bytearray(data)
    for at in range(8 + int.from_bytes(data[:8], "little"), len(data), 1 << 20):
        forged[at] ^= 0xFF
    blob.write_bytes(bytes(forged))
    url = "hf://org/ranged"

    def failed(node: Any) -> bool:
        return bool(node.model("bad")["status"] == "failed")

    # No try but the ones asked for: a node's own retry 0.6 s after the refusal read the
    # blob while the test wrote the true one, and failed with "changed on the server"
    # just as the test asked it again.
    slow = ["--retry-backoff", "600", "--retry-backoff-max", "600"]
    with Fleet(3, tmp_path / "fleet", swarm=True, args=[*ARGS, *slow], env=env) as fleet:
        fleet.start()
        for i in range(3):
            fleet.post(i, url, "bad")
        for i in range(3):
            fleet.wait_for(fleet[i], failed, 180, "the forged file refused")
        logs = [fleet[i].output() for i in range(3)]
        said = "model.safetensors: the file assembled from its ranges does not match the sha256"
        assert any(said in log for log in logs), logs[0][-3000:]
        for i in range(3):
            assert not [u for u in _entries(fleet[i].cache_dir) if u.endswith("model.safetensors")]
        blob.write_bytes(data)
        for i in range(3):
            fleet.post(i, url, "bad")  # asked again: fetched again, now
        for i in range(3):
            fleet.wait_for(fleet[i], lambda n: not failed(n), 30, "the fetch asked again")
        fleet.wait_all("bad", seconds=180)
        for i in range(3):
            (held,) = [
                p for u, p in _entries(fleet[i].cache_dir).items() if u.endswith(".safetensors")
            ]
            assert held.read_bytes() == data, f"node {i}: its copy differs"

"""Range torrents (swarm/range_torrents.py), for real: libtorrent sessions on 127.0.0.x
fetch one byte range of a file into a partial file of the whole file's size, at the
range's offset, and nothing else of it moves; every byte compared."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

pytest.importorskip("libtorrent")

from aioloader.swarm import range_torrents as rt
from aioloader.swarm.range_torrents import (
    FILLER,
    RangeError,
    add_params,
    describe_range,
    info_only,
    make_range_torrent,
    served,
)
from aioloader.swarm.scratch import linked, unlinked
from aioloader.swarm.session import Swarm
from aioloader.swarm.settings_pack import settings_pack
from aioloader.swarm.torrents import info_hash, libtorrent

from . import test_swarm_session

P = 64 << 10  # the piece of the small files here
NAME = "model.safetensors"


swarms = test_swarm_session.swarms  # the sessions a test made, closed after it


async def _swarm(made: list[Swarm], n: int, allow: list[int], rate: int = 0) -> Swarm:
    swarm = Swarm(f"127.0.0.{n}", 0, stall=60, rate=rate)
    made.append(swarm)
    await swarm.start()
    await swarm.allow([f"127.0.0.{i}" for i in allow])
    return swarm


async def _until(check: Callable[[], Awaitable[bool]], seconds: float = 30) -> None:
    """Poll ``check`` (a libtorrent count: nothing to wait on) up to ``seconds``."""
    async with asyncio.timeout(seconds):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


def _partial(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _holding(data: bytes, ranges: list[tuple[int, int]], rest: bytes | None = None) -> bytes:
    """A partial file of ``data``'s size holding ``ranges`` of it; ``rest`` elsewhere
    (zeros by default: a file being written)."""
    out = bytearray(bytes(len(data)) if rest is None else rest)
    for offset, length in ranges:
        out[offset : offset + length] = data[offset : offset + length]
    return bytes(out)


async def _torrent(path: Path, offset: int, length: int, size: int, piece: int = P) -> bytes:
    return await asyncio.to_thread(make_range_torrent, path, offset, length, size, NAME, piece)


# -- 1 and 3: a range lands at its offset, from the whole torrent or its info dict alone ------


@pytest.mark.parametrize(
    ("size", "offset", "length", "info_dict_only"),
    [
        (20 * P + 1234, 4 * P, 5 * P, False),  # the middle of the file
        (20 * P + 1234, 4 * P, 5 * P, True),  # the same, the hashes from the seeder
        (20 * P + 1234, 16 * P, 4 * P + 1234, True),  # the tail: ends at the file's end
        (20 * P + 1234, 0, P, True),  # one piece, the first
        (P // 2 + 3, 0, P // 2 + 3, True),  # a file of one piece: no piece layer
    ],
)
async def test_a_range_lands_at_its_offset_and_nothing_else_of_the_file_moves(
    tmp_path: Path,
    swarms: list[Swarm],
    size: int,
    offset: int,
    length: int,
    info_dict_only: bool,
) -> None:
    data = os.urandom(size)
    seeded = _holding(data, [(offset, length)])
    source = _partial(tmp_path / "a" / "data.partial", seeded)
    # The follower's partial file: other data in its first half, zeros in the rest.
    before = os.urandom(size // 2) + bytes(size - size // 2)
    into = _partial(tmp_path / "b" / "data.partial", before)
    torrent = await _torrent(source, offset, length, size)
    assert describe_range(torrent) == (NAME, size, offset, length, P)
    sent = info_only(torrent) if info_dict_only else torrent
    assert describe_range(sent) == (NAME, size, offset, length, P)
    assert info_hash(sent) == info_hash(torrent)

    seeder = await _swarm(swarms, 21, [22])
    follower = await _swarm(swarms, 22, [21])
    await seeder.seed_range(torrent, source)
    download = await follower.download_range(sent, into, [("127.0.0.21", seeder.port)])
    async with asyncio.timeout(60):
        await download.wait_range(offset, offset + length)
    got = into.read_bytes()
    assert len(got) == size
    assert got[offset : offset + length] == data[offset : offset + length]
    assert got[:offset] == before[:offset]
    assert got[offset + length :] == before[offset + length :]
    assert source.read_bytes() == seeded  # the seeder's file: as it was
    assert download.bytes_from_peers >= length

    async def counted() -> bool:  # libtorrent counts bytes sent once a second
        return (await seeder.refresh()).uploaded[info_hash(torrent)] >= length

    await _until(counted, 5)
    await asyncio.sleep(1.5)  # and no more after the next count
    stats = await seeder.refresh()
    assert length <= stats.uploaded[info_hash(torrent)] < length + P  # the range, once
    await download.aclose()


# -- 2: the seeder reads the range only; 3: what a torrent weighs -------------------------


def _session(n: int) -> object:
    lt = libtorrent()
    session = lt.session(settings_pack(f"127.0.0.{n}", 0, 0), 0)
    session.add_extension("smart_ban")
    return session


def _stats(session: object) -> dict[str, int]:
    """The session's counters by name, read now (blocking)."""
    import libtorrent as lt

    session.post_session_stats()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        session.wait_for_alert(100)  # type: ignore[attr-defined]
        for alert in session.pop_alerts():  # type: ignore[attr-defined]
            if isinstance(alert, lt.session_stats_alert):
                return {str(name): int(value) for name, value in alert.values.items()}
    raise AssertionError("no session_stats_alert within 10 s")


def _port(session: object) -> int:
    return int(session.listen_port())  # type: ignore[attr-defined]


def test_a_seeder_of_one_range_of_a_64_gib_file_reads_that_range_only(tmp_path: Path) -> None:
    """A sparse 64 GiB file holding 8 MiB at 32 GiB: hashing it whole would take
    minutes; the seeder hashes nothing, reads no more than the range it sends, and
    neither file changes size nor gets a byte outside the range."""
    size, piece, offset, length = 64 << 30, 4 << 20, 32 << 30, 8 << 20
    data = os.urandom(length)
    source, into = tmp_path / "a.partial", tmp_path / "b.partial"
    for path in (source, into):
        with open(path, "wb") as file:
            file.truncate(size)
    with open(source, "r+b") as file:
        file.seek(offset)
        file.write(data)
    started = time.monotonic()
    torrent = make_range_torrent(source, offset, length, size, NAME, piece)
    assert time.monotonic() - started < 20  # 8 MiB hashed, not 64 GiB
    assert len(torrent) > 16384 * 32  # the piece layer: 32 B a piece of the whole file
    assert len(info_only(torrent)) < 300

    lt = libtorrent()
    seeder, follower = _session(31), _session(32)
    try:
        seed = seeder.add_torrent(add_params(torrent, source, seed=True))  # type: ignore[attr-defined]
        seed.resume()
        fetch = follower.add_torrent(add_params(info_only(torrent), into, seed=False))  # type: ignore[attr-defined]
        fetch.resume()
        fetch.connect_peer(("127.0.0.31", _port(seeder)))
        deadline = time.monotonic() + 60
        while fetch.status(0).total_wanted_done < length:
            assert time.monotonic() < deadline, "the range did not arrive within 60 s"
            time.sleep(0.05)
        assert fetch.status(0).total_wanted == length
        assert time.monotonic() - started < 30
        fetch.flush_cache()
        status = seed.status(seed.query_pieces)
        assert [i for i, had in enumerate(status.pieces) if had] == list(
            range(offset // piece, (offset + length) // piece)
        )
        assert status.state != lt.torrent_status.checking_files
        counts = _stats(seeder)
        assert counts["disk.num_blocks_hashed"] == 0
        assert 0 < counts["disk.num_blocks_read"] * rt.BLOCK <= length
        deadline = time.monotonic() + 10
        while True:  # the follower's writes land (flush_cache)
            with open(into, "rb") as file:
                file.seek(offset)
                if file.read(length) == data:
                    break
            assert time.monotonic() < deadline, "the follower's file lacks the range"
            time.sleep(0.05)
    finally:
        for session in (seeder, follower):
            session.pause()  # type: ignore[attr-defined]
        del seeder, follower
    for path in (source, into):
        stat = os.stat(path)
        assert stat.st_size == size
        assert stat.st_blocks * 512 < length + (8 << 20)  # still sparse: nothing else written


@pytest.mark.parametrize(("piece", "most"), [(4 << 20, 830_000), (16 << 20, 210_000)])
def test_a_range_torrent_of_100_gib_weighs_32_bytes_a_piece_its_info_dict_250(
    tmp_path: Path, piece: int, most: int
) -> None:
    size = 100 << 30
    path = tmp_path / "sparse.partial"
    with open(path, "wb") as file:
        file.truncate(size)
    torrent = make_range_torrent(path, 40 << 30, 256 << 20, size, NAME, piece)
    assert size // piece * 32 < len(torrent) < most
    assert len(info_only(torrent)) < 260
    assert describe_range(torrent) == (NAME, size, 40 << 30, 256 << 20, piece)


# -- 4: ranges of one file, at once, into one partial file ------------------------------------


async def test_ranges_of_one_file_fill_one_partial_file_at_once(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    """Three nodes each hold one range of the file and seed it while fetching the other
    two into the same partial file; a fourth fetches all three at once."""
    size = 12 * P + 777
    data = os.urandom(size)
    ranges = [(0, 4 * P), (4 * P, 4 * P), (8 * P, 4 * P + 777)]
    nodes = [await _swarm(swarms, 41 + i, [41, 42, 43, 44]) for i in range(4)]
    addresses = [(f"127.0.0.{41 + i}", node.port) for i, node in enumerate(nodes)]
    files = [
        _partial(tmp_path / f"n{i}" / "data.partial", _holding(data, ranges[i : i + 1]))
        for i in range(3)
    ]
    files.append(_partial(tmp_path / "n3" / "data.partial", bytes(size)))
    torrents = [await _torrent(files[i], *ranges[i], size) for i in range(3)]
    assert len({info_hash(t) for t in torrents}) == 3  # the range is in the info hash
    for i in range(3):
        await nodes[i].seed_range(torrents[i], files[i])
    downloads = []
    for n, node in enumerate(nodes):
        for i, torrent in enumerate(torrents):
            if i != n:
                peers = [a for j, a in enumerate(addresses) if j != n]
                downloads.append(
                    (ranges[i], await node.download_range(info_only(torrent), files[n], peers))
                )
    async with asyncio.timeout(60):
        for (offset, length), download in downloads:
            await download.wait_range(offset, offset + length)
    for path in files:
        assert path.read_bytes() == data
    for _, download in downloads:
        await download.aclose()


# -- 5: followers of one seeder trade the range among themselves ------------------------------


async def test_followers_of_one_seeder_trade_the_range(tmp_path: Path, swarms: list[Swarm]) -> None:
    size, offset, length = 40 * P, 8 * P, 32 * P  # 2 MiB, to the end of the file
    data = os.urandom(size)
    source = _partial(tmp_path / "s" / "data.partial", _holding(data, [(offset, length)]))
    torrent = await _torrent(source, offset, length, size)
    key = info_hash(torrent)
    seeder = await _swarm(swarms, 51, [52, 53, 54], rate=1_000_000)  # 1 MB/s out
    followers = [await _swarm(swarms, 52 + i, [51, 52, 53, 54]) for i in range(3)]
    await seeder.seed_range(torrent, source)
    everyone = [("127.0.0.51", seeder.port)] + [
        (f"127.0.0.{52 + i}", f.port) for i, f in enumerate(followers)
    ]
    downloads = []
    for i, follower in enumerate(followers):
        into = _partial(tmp_path / f"f{i}" / "data.partial", bytes(size))
        peers = [a for a in everyone if a[0] != follower.host]
        downloads.append((into, await follower.download_range(info_only(torrent), into, peers)))
    async with asyncio.timeout(60):
        for _, download in downloads:
            await download.wait_range(offset, offset + length)
    await asyncio.sleep(1.5)  # libtorrent counts bytes sent once a second
    sent = (await seeder.refresh()).uploaded[key]
    traded = [(await f.refresh()).uploaded[key] for f in followers]
    print(f"seeder sent {sent}, followers {traded}, range {length}")
    for into, download in downloads:
        assert into.read_bytes() == _holding(data, [(offset, length)])
        await download.aclose()
    assert sum(traded) > 0, "no follower sent a piece to another"
    assert sent + sum(traded) >= 3 * length
    assert sent < 3 * length  # the seeder's range left it fewer than three times


async def test_followers_sharing_a_slow_seeder_all_get_the_range_as_served(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    """Three followers of a 16 MiB range at the end of a 1 GiB file (1 MiB pieces), from
    a seeder sending 5 MB/s: given the info dict alone, all three lost the seeder after
    their first pieces, every time ("no piece for 10 s (1% done, 2 of 3 peers
    connected)"); given the torrent as ``served`` (its piece layers with it), they finish."""
    piece = 1 << 20
    size = (1 << 30) + 376
    offset = size - (16 << 20) - 376
    length = size - offset
    data = os.urandom(length)
    files = []
    for name in ("s", "f0", "f1", "f2"):
        path = tmp_path / name / "data.partial"
        path.parent.mkdir()
        with open(path, "wb") as file:
            file.truncate(size)  # sparse: a file being written
        files.append(path)
    with open(files[0], "r+b") as file:
        file.seek(offset)
        file.write(data)
    torrent = await _torrent(files[0], offset, length, size, piece)
    given = served(torrent)
    assert given == torrent  # 1024 pieces: 32 KiB of layer, given whole
    hosts = [f"127.0.0.{56 + i}" for i in range(4)]
    nodes = []
    for i, host in enumerate(hosts):
        node = Swarm(host, 0, stall=10, rate=5_000_000 if i == 0 else 0)
        swarms.append(node)
        await node.start()
        await node.allow(hosts)
        nodes.append(node)
    await nodes[0].seed_range(torrent, files[0])
    everyone = [(host, node.port) for host, node in zip(hosts, nodes, strict=True)]
    downloads = [
        await nodes[i].download_range(given, files[i], [a for a in everyone if a[0] != hosts[i]])
        for i in (1, 2, 3)
    ]
    async with asyncio.timeout(90):
        for download in downloads:
            await download.wait_range(offset, offset + length)
    for path, download in zip(files[1:], downloads, strict=True):
        await download.aclose()
        with open(path, "rb") as file:
            file.seek(offset)
            assert file.read() == data


async def test_a_range_whose_pieces_arrive_slowly_is_not_stalled(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    """A range torrent's pieces are 1 MiB: a follower sharing its owner's uplink with 30
    others gets blocks of a piece for many seconds before the piece is whole. Counting
    only whole pieces, its download was "stalled" with bytes arriving all along (32
    nodes: "no piece for 30 s (0% done)"); the blocks count. Here a 2 MiB range comes
    at 150 kB/s: its first piece is whole after 7 s, past the stall time of 5."""
    piece, size = 1 << 20, 80 << 20
    offset, length = 8 << 20, 2 << 20
    data = os.urandom(length)
    files = []
    for name in ("s", "f"):
        path = tmp_path / name / "data.partial"
        path.parent.mkdir()
        with open(path, "wb") as file:
            file.truncate(size)
        files.append(path)
    with open(files[0], "r+b") as file:
        file.seek(offset)
        file.write(data)
    torrent = await _torrent(files[0], offset, length, size, piece)
    seeder = await _swarm(swarms, 91, [92], rate=150_000)
    follower = Swarm("127.0.0.92", 0, stall=5)
    swarms.append(follower)
    await follower.start()
    await follower.allow(["127.0.0.91"])
    await seeder.seed_range(torrent, files[0])
    peers = [("127.0.0.91", seeder.port)]
    download = await follower.download_range(served(torrent), files[1], peers)
    async with asyncio.timeout(60):
        await download.wait_range(offset, offset + length)
    await download.aclose()
    with open(files[1], "rb") as file:
        file.seek(offset)
        assert file.read(length) == data


def test_a_range_torrent_is_served_whole_up_to_a_bound(tmp_path: Path) -> None:
    path = tmp_path / "sparse.partial"
    with open(path, "wb") as file:
        file.truncate(100 << 30)
    small = make_range_torrent(path, 40 << 30, 64 << 20, 100 << 30, NAME, 16 << 20)
    large = make_range_torrent(path, 40 << 30, 64 << 20, 100 << 30, NAME, 1 << 20)
    assert len(small) <= rt.SERVED_WHOLE < len(large)
    assert served(small) == small
    assert served(large) == info_only(large)


# -- 6: hostile ---------------------------------------------------------------------------


async def test_a_partial_file_of_another_size_is_refused_and_left_alone(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    size = 8 * P
    data = os.urandom(size)
    source = _partial(tmp_path / "s" / "data.partial", data)
    torrent = await _torrent(source, 2 * P, 2 * P, size)
    node = await _swarm(swarms, 61, [])
    for wrong in (size - 1, size + 1, 0):
        content = os.urandom(wrong)
        path = _partial(tmp_path / f"w{wrong}" / "data.partial", content)
        with pytest.raises(RangeError, match=rf"{wrong} bytes, but .* of a file of {size} bytes"):
            await node.download_range(torrent, path, [])
        with pytest.raises(RangeError, match=rf"{wrong} bytes, but .* of a file of {size} bytes"):
            await node.seed_range(torrent, path)
        assert path.read_bytes() == content
        with pytest.raises(RangeError, match=rf"{wrong} bytes, not the {size}"):
            await _torrent(path, 0, P, size)
    with pytest.raises(FileNotFoundError):
        await node.download_range(torrent, tmp_path / "missing.partial", [])
    assert not node.seeding(info_hash(torrent))


@pytest.mark.parametrize(
    ("offset", "length", "size", "piece", "error"),
    [
        (0, 9 * P, 8 * P, P, "inside the file"),  # past the end
        (8 * P, P, 8 * P, P, "inside the file"),  # starts at the end
        (-P, 2 * P, 8 * P, P, "inside the file"),
        (P, 0, 8 * P, P, "inside the file"),  # empty
        (P + 1, P, 8 * P, P, "not aligned"),
        (P, P + 1, 8 * P, P, "not aligned"),  # ends inside a piece, not at the file's end
        (0, P, 8 * P, 3 * P, "power of two"),
        (0, 8 * 1024, 8 * 1024, 8 * 1024, "power of two"),  # under 16 KiB
        (0, 100, P // 2, P, "not aligned"),  # a file of one piece: one range, all of it
        (0, 0, 0, P, "empty file"),
    ],
)
def test_a_range_outside_the_file_or_off_the_pieces_is_refused(
    tmp_path: Path, offset: int, length: int, size: int, piece: int, error: str
) -> None:
    path = _partial(tmp_path / "data.partial", os.urandom(size))
    with pytest.raises(RangeError, match=error):
        make_range_torrent(path, offset, length, size, NAME, piece)


def _edited(torrent: bytes, edit: Callable[[dict[bytes, rt.Bencoded]], None]) -> bytes:
    top = rt.bdecode(torrent)
    assert isinstance(top, dict)
    edit(top)
    return rt.bencode(top)


def _info(top: dict[bytes, rt.Bencoded]) -> dict[bytes, rt.Bencoded]:
    info = top[b"info"]
    assert isinstance(info, dict)
    return info


def _layer(top: dict[bytes, rt.Bencoded]) -> tuple[bytes, list[bytes]]:
    layers = top[b"piece layers"]
    assert isinstance(layers, dict)
    root, layer = next(iter(layers.items()))
    assert isinstance(layer, bytes)
    return root, [layer[i : i + 32] for i in range(0, len(layer), 32)]


def _set_layer(top: dict[bytes, rt.Bencoded], hashes: list[bytes], piece: int = P) -> None:
    """Put ``hashes`` in as the layer, with the root they hash to (a consistent lie)."""
    root = rt._root(hashes, rt._width(len(hashes)), rt._pad_root(piece // rt.BLOCK))
    top[b"piece layers"] = {root: b"".join(hashes)}
    tree = _info(top)[b"file tree"]
    assert isinstance(tree, dict)
    tree[NAME.encode()] = {b"": {b"length": 8 * P, b"pieces root": root}}


def test_a_torrent_that_is_not_one_honest_range_is_refused(tmp_path: Path) -> None:
    size = 8 * P
    path = _partial(tmp_path / "data.partial", os.urandom(size))
    torrent = make_range_torrent(path, 2 * P, 3 * P, size, NAME, P)
    root, hashes = _layer(rt.bdecode(torrent))  # type: ignore[arg-type]
    assert [h == FILLER for h in hashes] == [True, True, False, False, False, True, True, True]

    def flip(top: dict[bytes, rt.Bencoded]) -> None:  # a layer that is not its root's
        layer = bytearray(b"".join(hashes))
        layer[2 * 32] ^= 1
        top[b"piece layers"] = {root: bytes(layer)}

    def moved(bounds: list[rt.Bencoded]) -> Callable[[dict[bytes, rt.Bencoded]], None]:
        return lambda top: _info(top).__setitem__(rt.RANGE_KEY, bounds)

    def two_ranges(top: dict[bytes, rt.Bencoded]) -> None:
        _set_layer(top, [*hashes[:6], hashes[2], *hashes[7:]])

    def filler_inside(top: dict[bytes, rt.Bencoded]) -> None:
        _set_layer(top, [*hashes[:3], FILLER, *hashes[4:]])

    def second_file(top: dict[bytes, rt.Bencoded]) -> None:
        tree = _info(top)[b"file tree"]
        assert isinstance(tree, dict)
        tree[b"other"] = tree[NAME.encode()]

    cases: list[tuple[Callable[[dict[bytes, rt.Bencoded]], None], str]] = [
        (flip, "does not hash to the file's pieces root"),
        (moved([3 * P, 3 * P]), "not exactly the range's pieces"),
        (moved([2 * P, 9 * P]), "inside the file"),
        (moved([2 * P + 1, 3 * P]), "not aligned"),
        (moved([2 * P]), r"not \[offset, length\]"),
        (two_ranges, "not exactly the range's pieces"),
        (filler_inside, "not exactly the range's pieces"),
        (second_file, "exactly one file"),
        (lambda top: _info(top).__setitem__(b"private", 0), "not private"),
        (lambda top: _info(top).__setitem__(b"meta version", 1), "not a v2 torrent"),
        (lambda top: _info(top).__setitem__(b"pieces", b"x" * 20), "keys are"),  # hybrid
        (lambda top: _info(top).pop(rt.RANGE_KEY), "keys are"),  # a whole-file torrent
        (lambda top: _info(top).__setitem__(b"name", b"../x"), "exactly one file"),
        (lambda top: top.pop(b"info"), "info is not a dict"),
    ]
    for edit, error in cases:
        with pytest.raises(RangeError, match=error):
            describe_range(_edited(torrent, edit))
    # Without its layer, a torrent's range is checked as far as the info dict goes.
    for bounds, error in [([2 * P, 9 * P], "inside the file"), ([P + 1, P], "not aligned")]:
        with pytest.raises(RangeError, match=error):
            describe_range(_edited(info_only(torrent), moved(bounds)))
    with pytest.raises(RuntimeError, match="piece layer is invalid"):
        libtorrent().torrent_info(_edited(torrent, flip))  # libtorrent refuses it too
    for junk in (b"", b"garbage", torrent + b"x", torrent.replace(b"i65536e", b"i065536e")):
        with pytest.raises(RangeError, match="not a bencoded torrent"):
            describe_range(junk)


async def test_a_peer_sending_wrong_bytes_for_the_range_is_banned_and_the_range_completes(
    tmp_path: Path, swarms: list[Swarm]
) -> None:
    """A seeder takes its range's pieces for had, as written: one whose bytes rotted
    sends them as they are; the follower's checks fail them, it bans the peer and
    takes the range from an honest one."""
    size, offset, length = 24 * P, 8 * P, 8 * P
    data = os.urandom(size)
    good = _partial(tmp_path / "good" / "data.partial", _holding(data, [(offset, length)]))
    torrent = await _torrent(good, offset, length, size)
    rotten = bytearray(good.read_bytes())
    for at in range(offset, offset + length, 4096):
        rotten[at] ^= 0xFF
    bad = _partial(tmp_path / "bad" / "data.partial", bytes(rotten))
    honest = await _swarm(swarms, 71, [73])
    liar = await _swarm(swarms, 72, [73])
    follower = await _swarm(swarms, 73, [71, 72])
    await honest.seed_range(torrent, good)
    await liar.seed_range(torrent, bad)
    before = os.urandom(size)
    into = _partial(tmp_path / "in" / "data.partial", before)
    download = await follower.download_range(info_only(torrent), into, [("127.0.0.72", liar.port)])

    async def banned() -> bool:
        return (await follower.refresh()).banned >= 1

    await _until(banned, 60)
    assert follower.statistics().hash_failures >= 1
    download.connect([("127.0.0.71", honest.port)])
    async with asyncio.timeout(60):
        await download.wait_range(offset, offset + length)
    assert into.read_bytes() == _holding(data, [(offset, length)], before)
    assert bad.read_bytes() == bytes(rotten)  # nobody wrote to the liar's file


# -- a range seeded across the cache's commit (scratch.py's ``linked``) ----------------------


@pytest.mark.parametrize("through_a_link", [True, False])
async def test_a_range_seeded_through_a_link_is_served_after_the_entry_is_committed(
    tmp_path: Path, swarms: list[Swarm], through_a_link: bool
) -> None:
    """The cache commits an entry by renaming its partial file; a range torrent seeded
    from the partial file's own name then fails ("No such file or directory") when a
    peer asks for a piece: at 32 nodes, 60 torrents failed so, each in the window
    before the node seeded it again from the committed file. Seeded through a hard
    link in the swarm's scratch folder, the range is served across the rename."""
    size, offset, length = 40 * P, 8 * P, 16 * P
    data = os.urandom(size)
    partial = _partial(tmp_path / "entry" / "data.partial", _holding(data, [(offset, length)]))
    seeded = linked(partial, tmp_path / "scratch") if through_a_link else partial
    assert seeded.stat().st_ino == partial.stat().st_ino
    assert (seeded != partial) is through_a_link
    torrent = await _torrent(seeded, offset, length, size)
    seeder = await _swarm(swarms, 61, [62])
    follower = await _swarm(swarms, 62, [61])
    await seeder.seed_range(torrent, seeded)
    partial.rename(partial.with_name("data"))  # the commit
    into = _partial(tmp_path / "f" / "data.partial", bytes(size))
    download = await follower.download_range(
        info_only(torrent), into, [("127.0.0.61", seeder.port)]
    )
    try:
        if through_a_link:
            async with asyncio.timeout(60):
                await download.wait_range(offset, offset + length)
            assert into.read_bytes() == _holding(data, [(offset, length)])
            assert info_hash(torrent) not in seeder.failed
        else:
            await _until(lambda: _failed(seeder, info_hash(torrent)), 60)
    finally:
        await download.aclose()
    unlinked(seeded, partial)
    assert not seeded.exists()  # the link removed; without one, the partial file renamed
    assert (tmp_path / "entry" / "data").read_bytes() == _holding(data, [(offset, length)])


async def _failed(swarm: Swarm, key: str) -> bool:
    await swarm.refresh()
    return key in swarm.failed


def test_no_link_across_file_systems_means_the_file_s_own_name(tmp_path: Path) -> None:
    """Where the scratch folder is on another file system, no link can be made: the
    torrents use the partial file's own name, as they did before links."""
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system at /dev/shm")
    partial = _partial(tmp_path / "entry" / "data.partial", b"x" * 100)
    folder = other / f"aioloader-test-{os.getpid()}"
    try:
        assert linked(partial, folder) == partial
        unlinked(partial, partial)
        assert partial.read_bytes() == b"x" * 100
    finally:
        for leftover in folder.glob("*"):
            leftover.unlink()
        folder.rmdir()

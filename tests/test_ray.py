"""aioloader in Ray: loads inside actors, ``preload`` on every node, one host copy per node.

A real local Ray cluster (``ray.cluster_utils.Cluster``, 3 nodes of 1 CPU) serves as
the cluster; weights come from a loopback HTTP server and a loopback S3 server. The
preloads that share one download through the swarm need libtorrent (the ``swarm``
extra, which ``scripts/ray_setup.sh`` installs); the origin counts the bytes it sends.
All the test nodes share this machine's file system, so each gets its own cache
folder through ``{node_id}`` in ``cache_dir``. Skipped where Ray is not installed
(``scripts/ray_setup.sh`` makes ``.venv-ray``; ``scripts/test.sh`` runs this file
there).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import aioloader  # noqa: E402
from aioloader.ray import load_shared, preload, release_shared, stop_agents  # noqa: E402

from .helpers import assert_matches_files, write_sharded  # noqa: E402
from .servers import FaultyHttpServer, MotoS3Server  # noqa: E402

MiB = 1 << 20


def model(folder: Path, megabytes: int = 16, seed: int = 0) -> list[Path]:
    gen = torch.Generator().manual_seed(seed)
    count = megabytes  # 1 MiB tensors
    tensors = {f"w.{i:03d}": torch.randn(MiB // 4, generator=gen) for i in range(count)}
    tensors["bf16"] = torch.randn(1000, generator=gen).to(torch.bfloat16)
    index = write_sharded(folder, tensors, shards=2)
    return sorted(index.parent.glob("*.safetensors"))


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, moto_server: MotoS3Server
) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ray")
    with pytest.MonkeyPatch.context() as patch:
        moto_server.set_env(patch, tmp)  # the workers inherit the S3 settings
        patch.setenv("RAY_DEDUP_LOGS", "0")
        # Ray runs its workers at nice 15: on a busy machine (a test run beside others)
        # they then get a few percent of a core, and starting one replica took 40 s.
        # The test's workers compete like any process instead.
        patch.setenv("RAY_worker_niceness", "0")
        nodes = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1, "object_store_memory": 256 * MiB, "include_dashboard": False,
            },
        )  # fmt: skip
        for _ in range(2):
            nodes.add_node(num_cpus=1, object_store_memory=256 * MiB)
        ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
        try:
            yield {"cluster": nodes, "tmp": tmp, "moto": moto_server}
        finally:
            ray.shutdown()
            nodes.shutdown()


def alive_nodes() -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


def test_preload_fills_every_node_and_again_finds_it_cached(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    files = model(http_server.root / "m")
    url = http_server.url_for("m/model.safetensors.index.json")
    index = http_server.root / "m" / "model.safetensors.index.json"
    size = sum(p.stat().st_size for p in files) + index.stat().st_size
    template = str(tmp_path / "cache-{node_id}")

    first = preload(url, cache_dir=template, concurrency=4)
    assert [r.node_id for r in first] == alive_nodes() and len(first) == 3
    for result in first:
        assert result.ok, result
        assert result.fetched == size and result.cached == 0
        assert result.cache_dir == template.format(node_id=result.node_id)
    for result in first:  # every node's copy, bit for bit
        assert_matches_files(_load_sync(url, result.cache_dir, http_server), *files)

    again = preload(url, cache_dir=template)
    assert all(r.ok and r.fetched == 0 and r.cached == size for r in again), again


def _load_sync(url: str, cache_dir: str, server: FaultyHttpServer) -> dict[str, Any]:
    import asyncio

    server.reset_counters()
    got = asyncio.run(aioloader.load_model(url, cache_dir=cache_dir))
    assert all(r.range and r.range.startswith("bytes=0-") for r in server.gets())  # probes only
    return got


def test_preload_from_s3_on_chosen_nodes(cluster: dict[str, Any], tmp_path: Path) -> None:
    files = model(tmp_path / "m", megabytes=8, seed=2)
    server = _moto(cluster)
    server.upload("ray-bucket", "m", tmp_path / "m")
    nodes = alive_nodes()[:2]
    results = preload("s3://ray-bucket/m/", cache_dir=str(tmp_path / "c-{node_id}"), nodes=nodes)
    assert [r.node_id for r in results] == nodes
    assert all(r.ok and r.fetched > sum(p.stat().st_size for p in files) for r in results), results
    assert not any(Path(tmp_path / f"c-{n}").exists() for n in alive_nodes()[2:])


def _moto(cluster: dict[str, Any]) -> MotoS3Server:
    # The session's moto server: the fixture is module-scoped through `cluster`.
    server: MotoS3Server = cluster["moto"]
    return server


def test_a_failing_node_is_reported_beside_the_others(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    model(http_server.root / "m")
    url = http_server.url_for("m/model.safetensors.index.json")
    nodes = [*alive_nodes(), "f" * 56]
    results = preload(url, cache_dir=str(tmp_path / "c-{node_id}"), nodes=nodes)
    assert all(r.ok for r in results[:3]) and "no alive Ray node" in (results[3].error or "")

    nowhere = http_server.url_for("nowhere/model.safetensors")
    missing = preload(nowhere, cache_dir=str(tmp_path / "x-{node_id}"))
    assert len(missing) == 3 and all("NotFoundError" in (r.error or "") for r in missing)


@ray.remote(num_cpus=0)
class Replica:
    """An async actor that loads a model and answers pings meanwhile."""

    async def load(self, url: str, cache_dir: str | None = None) -> int:
        tensors = await aioloader.load_model(
            url, cache_dir=cache_dir or False, concurrency=2, chunk_size="1MiB"
        )
        self.tensors = tensors
        return len(tensors)

    async def ping(self) -> float:
        return time.monotonic()

    async def shared(self, url: str) -> dict[str, Any]:
        self.tensors = await load_shared(url, cache_dir=False)
        return {
            "names": sorted(self.tensors),
            "digests": {n: _digest(t) for n, t in self.tensors.items()},
            "memory": _memory(),
        }

    async def shared_with(self, url: str, options: dict[str, Any]) -> dict[str, Any]:
        try:
            tensors = await load_shared(url, cache_dir=False, **options)
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"digests": {n: _digest(t) for n, t in tensors.items()}}

    async def shared_cached(
        self, url: str, cache_dir: str, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """load_shared through the node cache: digests, and the RuntimeWarnings said."""
        import warnings

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                tensors = await load_shared(url, cache_dir=cache_dir, **(options or {}))
            except Exception as exc:
                return {"error": f"{type(exc).__name__}: {exc}"}
        return {
            "digests": {n: _digest(t) for n, t in tensors.items()},
            "warnings": [str(w.message) for w in said if w.category is RuntimeWarning],
        }

    async def alone(self, url: str) -> dict[str, Any]:
        self.tensors = await aioloader.load_model(url, cache_dir=False)
        return {"memory": _memory()}


def _digest(tensor: torch.Tensor) -> str:
    import hashlib

    raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{tensor.dtype}{tuple(tensor.shape)}:{hashlib.sha256(raw).hexdigest()}"


def _memory() -> dict[str, int]:
    """This process's memory from /proc/self/smaps_rollup (kB): Rss, Pss, and USS."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    return {
        "rss": fields["Rss"],
        "pss": fields["Pss"],
        "uss": fields["Private_Clean"] + fields["Private_Dirty"],
    }


def test_an_actor_answers_during_its_load_and_a_killed_one_leaves_nothing_locked(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    files = model(http_server.root / "m", megabytes=8)
    url = http_server.url_for("m/model.safetensors.index.json")
    http_server.stall(None, 0.4, count=1000)  # 1 MiB reads, 2 at a time: about 4 s
    actor = Replica.remote()
    ray.get(actor.ping.remote())
    loading = actor.load.remote(url, str(tmp_path / "cache"))
    answered = []
    for _ in range(10):
        started = time.monotonic()
        ray.get(actor.ping.remote(), timeout=5)
        answered.append(time.monotonic() - started)
        time.sleep(0.1)
    assert max(answered) < 1.0, answered
    ray.kill(actor)  # mid-load: its cache entries are partial and locked by it
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(loading)

    http_server.clear_faults()
    fresh = Replica.remote()
    assert ray.get(fresh.load.remote(url, str(tmp_path / "cache")), timeout=60) == 9
    import asyncio

    again = asyncio.run(aioloader.load_model(url, cache_dir=str(tmp_path / "cache")))
    assert_matches_files(again, *files)


def test_replicas_on_a_node_share_one_host_copy(
    cluster: dict[str, Any], http_server: FaultyHttpServer
) -> None:
    files = model(http_server.root / "m", megabytes=64, seed=3)
    url = http_server.url_for("m/model.safetensors.index.json")
    size = sum(p.stat().st_size for p in files)
    node = alive_nodes()[1]
    pinned = NodeAffinitySchedulingStrategy(node, soft=False)
    http_server.reset_counters()
    replicas = [Replica.options(scheduling_strategy=pinned).remote() for _ in range(4)]
    shared = ray.get([r.shared.remote(url) for r in replicas], timeout=120)
    sent_shared = http_server.bytes_sent
    try:
        reference = {}
        from safetensors.torch import load_file

        for path in files:
            reference.update(load_file(path))
        for got in shared:
            assert got["names"] == sorted(reference)
            assert got["digests"] == {n: _digest(t) for n, t in reference.items()}  # bit for bit
        assert sent_shared < size * 1.2  # read once for the node, not four times

        loners = [Replica.options(scheduling_strategy=pinned).remote() for _ in range(2)]
        alone = ray.get([r.alone.remote(url) for r in loners])
        uss_shared = [g["memory"]["uss"] for g in shared]
        uss_alone = [g["memory"]["uss"] for g in alone]
        # A replica that loads alone owns the model's bytes; a sharing one does not.
        assert max(uss_shared) + size // 2048 < min(uss_alone), (uss_shared, uss_alone)
    finally:
        release_shared(url)


def test_load_shared_serves_each_caller_what_it_asked(
    cluster: dict[str, Any], http_server: FaultyHttpServer
) -> None:
    """Callers on one node with other tensors=, rows= or credentials get their own
    holder, never the tensors loaded for the first caller; no secret names an actor."""
    from safetensors.torch import load_file

    files = model(http_server.root / "m", megabytes=4, seed=5)
    url = http_server.url_for("m/model.safetensors.index.json")
    reference = {k: v for path in files for k, v in load_file(path).items()}
    secret = "Bearer hunter2-token"
    http_server.require_header("Authorization", secret)
    good = {"headers": {"Authorization": secret}}
    asks: list[dict[str, Any]] = [
        {**good, "tensors": ["w.000"]},
        {**good, "tensors": ["w.001", "bf16"]},
        {**good, "rows": {"w.002": (10, 20)}},
        good,
        {"headers": {"Authorization": "Bearer wrong"}},
        {},
    ]
    pinned = NodeAffinitySchedulingStrategy(alive_nodes()[2], soft=False)
    replica = Replica.options(scheduling_strategy=pinned).remote()
    try:
        got = [ray.get(replica.shared_with.remote(url, ask), timeout=120) for ask in asks]
        want = {n: _digest(t) for n, t in reference.items()}
        assert got[0] == {"digests": {"w.000": want["w.000"]}}
        assert got[1] == {"digests": {"w.001": want["w.001"], "bf16": want["bf16"]}}
        assert got[2] == {"digests": {**want, "w.002": _digest(reference["w.002"][10:20])}}
        assert got[3] == {"digests": want}
        # Without the right credentials the store refuses, whoever loaded it before.
        assert "AccessDeniedError" in got[4].get("error", ""), got[4]
        assert "AccessDeniedError" in got[5].get("error", ""), got[5]
        names = ray.util.list_named_actors(all_namespaces=True)
        assert not any("hunter2" in str(entry) for entry in names), names
    finally:
        for ask in asks:
            release_shared(url, **ask)
        ray.kill(replica)
        http_server.require_header("Authorization", None)


def test_load_shared_refuses_options_it_cannot_tell_apart(cluster: dict[str, Any]) -> None:
    import asyncio

    from aioloader import ConfigError, split_rows

    before = ray.util.list_named_actors(all_namespaces=True)
    url = "http://127.0.0.1:9/m.safetensors"  # never reached: refused first
    for options in (
        {"tensors": lambda name: name.startswith("w.")},
        {"rows": split_rows(0, 2)},
        {"group": object()},
        {"cache_dir": object()},
    ):
        with pytest.raises(ConfigError, match="load_shared"):
            asyncio.run(load_shared(url, **options))
        with pytest.raises(ConfigError, match="load_shared"):
            release_shared(url, **options)
    assert ray.util.list_named_actors(all_namespaces=True) == before


@pytest.mark.parametrize(
    "template",
    [
        "/c/{node}", "/c/{0}", "/c/{}", "/c/{node_id.__class__}", "/c/{node_id[0]}",
        "/c/{node_id!r}", "/c/{node_ip:>40}", "/c/{", "/c/}", "/c/{node_id", "",
    ],
)  # fmt: skip
def test_preload_refuses_a_cache_dir_template_it_cannot_fill(
    cluster: dict[str, Any], template: str
) -> None:
    from aioloader import ConfigError

    with pytest.raises(ConfigError, match="cache_dir") as info:
        preload("http://127.0.0.1:9/m.safetensors", cache_dir=template, timeout=1)
    assert "{node_id}" in str(info.value) or not template


def test_cache_dir_templates_that_are_filled() -> None:
    from aioloader.ray.preload import _cache_dir_for, check_cache_dir

    node = {"NodeID": "abc", "NodeManagerAddress": "10.0.0.7"}
    for template, want in [
        ("/c/{node_id}/{node_ip}", "/c/abc/10.0.0.7"),
        ("/c/{{literal}}-{node_id}", "/c/{literal}-abc"),
        ("/c/plain", "/c/plain"),
    ]:
        assert _cache_dir_for(check_cache_dir(template), node) == want
    assert check_cache_dir(Path("/c/{node_id}")) == "/c/{node_id}"


@pytest.mark.parametrize(
    "options",
    [{"timeout": float("nan")}, {"timeout": -1}, {"concurrency": 0}, {"concurrency": True}],
)
def test_preload_refuses_unusable_numbers(cluster: dict[str, Any], options: Any) -> None:
    from aioloader import ConfigError

    with pytest.raises(ConfigError, match=next(iter(options))):
        preload("http://127.0.0.1:9/m.safetensors", cache_dir="/c/{node_id}", **options)


# -- preload shares one download through the swarm ---------------------------------------


def _swarm() -> None:
    pytest.importorskip("libtorrent", reason="the swarm extra: bash scripts/ray_setup.sh")


def _sizes(files: list[Path], index: Path) -> int:
    return sum(p.stat().st_size for p in files) + index.stat().st_size


def _same_as_source(result: Any, files: list[Path], index: Path) -> None:
    """The node's cache entry of each file, bit for bit and as safetensors."""
    from safetensors.torch import load_file

    found = {p.name: p for p in Path(result.cache_dir).rglob("*") if p.is_file()}
    for source in [*files, index]:
        copies = [p for name, p in found.items() if name.endswith(source.name)]
        assert copies, f"{source.name} not in {result.cache_dir}"
        assert any(c.read_bytes() == source.read_bytes() for c in copies), source.name
    loaded = _load_cached(result.cache_dir, index)
    for path in files:
        for name, tensor in load_file(path).items():
            assert torch.equal(loaded[name].view(torch.uint8), tensor.view(torch.uint8)), name


def _load_cached(cache_dir: str, index: Path) -> dict[str, Any]:
    """The model as the node cache holds it, read with the safetensors library."""
    from safetensors.torch import load_file

    got: dict[str, Any] = {}
    for entry in Path(cache_dir).rglob("*.safetensors"):
        if ".swarm" not in entry.parts:
            got.update(load_file(entry))
    return got


def test_preload_shares_one_download_among_the_nodes(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """A cold 3-node cluster: the origin sends the model once, every node's cache holds
    it bit for bit, and a second preload downloads nothing."""
    _swarm()
    files = model(http_server.root / "m", megabytes=24, seed=7)
    index = http_server.root / "m" / "model.safetensors.index.json"
    url = http_server.url_for("m/model.safetensors.index.json")
    size = _sizes(files, index)
    template = str(tmp_path / "cache-{node_id}")

    first = preload(url, cache_dir=template)
    sent = http_server.bytes_sent
    assert len(first) == 3 and all(r.ok and r.shared for r in first), first
    assert sent <= size * 1.05, f"the origin sent {sent / size:.2f}x the model"
    assert all(r.fetched == size and r.cached == 0 for r in first), first
    assert sum(r.from_origin for r in first) <= size * 1.05, first
    assert sum(r.from_peers for r in first) >= size * 1.9, first  # 2 of 3 copies from peers
    for result in first:
        _same_as_source(result, files, index)

    http_server.reset_counters()
    again = preload(url, cache_dir=template)
    assert all(r.ok and r.fetched == 0 and r.cached == size for r in again), again
    assert all(r.from_peers == 0 for r in again), again
    # What the origin still sends: version probes (the first bytes of a file), never a
    # file's body.
    gets = http_server.gets()
    assert all(g.range and g.range.startswith("bytes=0-") for g in gets), gets
    assert http_server.bytes_sent < size * 0.1, http_server.bytes_sent


@pytest.mark.parametrize(
    "options",
    [
        {"share": "yes"}, {"share": 1}, {"share": 0}, {"share": ""}, {"share": [True]},
        {"swarm_port": -1}, {"swarm_port": 65536}, {"swarm_port": 10**100},
        {"swarm_port": True}, {"swarm_port": "6881"}, {"swarm_port": 1.5},
        {"swarm_port": None}, {"swarm_port": float("nan")},
    ],
)  # fmt: skip
def test_preload_refuses_unusable_sharing_options(cluster: dict[str, Any], options: Any) -> None:
    from aioloader import ConfigError

    before = ray.util.list_named_actors(all_namespaces=True)
    with pytest.raises(ConfigError, match=next(iter(options))):
        preload("http://127.0.0.1:9/m.safetensors", cache_dir="/c/{node_id}", **options)
    assert ray.util.list_named_actors(all_namespaces=True) == before


def test_preload_refuses_no_urls(cluster: dict[str, Any]) -> None:
    from aioloader import ConfigError

    with pytest.raises(ConfigError, match="no model URL"):
        preload([], cache_dir="/c/{node_id}")


def _wait_for(what: str, check: Any, seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s: {what}")


def _agent(node_id: str) -> Any:
    """The running preload's agent on ``node_id`` (named after the node)."""
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "aioloader" and a["name"].endswith(node_id[:16])
    ]
    return ray.get_actor(names[0], namespace="aioloader") if names else None


def test_a_node_whose_agent_is_killed_mid_preload_is_reported_and_the_others_finish(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    import threading

    _swarm()
    files = model(http_server.root / "m", megabytes=16, seed=8)
    index = http_server.root / "m" / "model.safetensors.index.json"
    url = http_server.url_for("m/model.safetensors.index.json")
    template = str(tmp_path / "c-{node_id}")
    http_server.stall(None, 0.5, count=1000)  # every read waits: the preload takes seconds
    victim = alive_nodes()[1]
    out: list[Any] = []
    worker = threading.Thread(
        target=lambda: out.append(preload(url, cache_dir=template, chunk_size="1MiB"))
    )
    worker.start()
    try:
        agent = _wait_for("the victim's agent", lambda: _agent(victim))
        _wait_for("the origin sending", lambda: http_server.bytes_sent > 0)
        ray.kill(agent)
    finally:
        worker.join(timeout=300)
    assert not worker.is_alive() and out, "preload did not return"
    results = {r.node_id: r for r in out[0]}
    dead = results.pop(victim)
    assert not dead.ok and "died" in (dead.error or "").lower(), dead
    for result in results.values():
        assert result.ok, result
        _same_as_source(result, files, index)

    http_server.clear_faults()  # the node killed gets its copy on the next preload
    again = {r.node_id: r for r in preload(url, cache_dir=template)}
    assert all(r.ok for r in again.values()), again
    _same_as_source(again[victim], files, index)


def test_two_preloads_of_one_model_at_once(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    _swarm()
    files = model(http_server.root / "m", megabytes=16, seed=9)
    index = http_server.root / "m" / "model.safetensors.index.json"
    url = http_server.url_for("m/model.safetensors.index.json")
    size = _sizes(files, index)
    template = str(tmp_path / "c-{node_id}")
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(preload, url, cache_dir=template) for _ in range(2)]
        both = [run.result(timeout=300) for run in runs]
    for results in both:
        assert len(results) == 3 and all(r.ok for r in results), results
    for result in both[0]:
        _same_as_source(result, files, index)
    # Each preload's nodes share; the two share the cache folders, not one swarm.
    assert http_server.bytes_sent <= size * 2.1, http_server.bytes_sent / size


def test_nodes_that_cannot_share_pull_alone_and_a_warning_says_what_it_costs(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """The swarm cannot listen on any node (its port is taken): each node pulls its own
    copy, caches are right, and a warning names the cost; share=True fails instead."""
    import socket

    _swarm()
    files = model(http_server.root / "m", megabytes=4, seed=10)
    index = http_server.root / "m" / "model.safetensors.index.json"
    url = http_server.url_for("m/model.safetensors.index.json")
    size = _sizes(files, index)
    host = ray.nodes()[0]["NodeManagerAddress"]
    with socket.socket() as taken:
        taken.bind((host, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.warns(RuntimeWarning, match=r"3 of 3 nodes .* about 3x the model") as said:
            alone = preload(url, cache_dir=str(tmp_path / "a-{node_id}"), swarm_port=port)
        assert f"{port}" in str(said[0].message)
        assert all(r.ok and not r.shared for r in alone), alone
        assert all(r.fetched == size and r.from_origin == size for r in alone), alone
        for result in alone:
            _same_as_source(result, files, index)

        strict = preload(url, cache_dir=str(tmp_path / "s-{node_id}"), swarm_port=port, share=True)
        assert all("share=True" in (r.error or "") for r in strict), strict

    http_server.reset_counters()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # share=False: chosen, so no warning
        off = preload(url, cache_dir=str(tmp_path / "o-{node_id}"), share=False)
    assert all(r.ok and not r.shared for r in off), off
    assert http_server.bytes_sent >= 3 * size


# -- load_shared shares one download through the swarm -----------------------------------


def _reference(files: list[Path]) -> dict[str, str]:
    from safetensors.torch import load_file

    return {n: _digest(t) for path in files for n, t in load_file(path).items()}


def _on_every_node() -> list[Any]:
    """One replica pinned to each alive node."""
    return [
        Replica.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        for n in alive_nodes()
    ]


def _agents_of(node_id: str) -> list[str]:
    """The names of load_shared's agents on ``node_id`` (named after the node)."""
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "aioloader" and a["name"].startswith(f"aioloader-agent-{node_id}")
    ]


def _only_probes(server: FaultyHttpServer) -> None:
    """The origin sent no file's body: version probes (a file's first bytes) at most."""
    gets = server.gets()
    assert all(g.range and g.range.startswith("bytes=0-") for g in gets), gets


def test_load_shared_on_three_nodes_shares_one_download(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """Actors on all 3 nodes at once: the origin sends the model once, every tensor is
    the source's bit for bit, and a second round (holders released) reads no body."""
    _swarm()
    stop_agents()
    files = model(http_server.root / "m", megabytes=24, seed=11)
    index = http_server.root / "m" / "model.safetensors.index.json"
    url = http_server.url_for("m/model.safetensors.index.json")
    size = _sizes(files, index)
    template = str(tmp_path / "ls-{node_id}")
    want = _reference(files)
    replicas = _on_every_node()
    http_server.reset_counters()
    try:
        first = ray.get([r.shared_cached.remote(url, template) for r in replicas], timeout=300)
        sent = http_server.bytes_sent
        assert all(got.get("digests") == want and not got["warnings"] for got in first), first
        assert sent <= size * 1.05, f"the origin sent {sent / size:.3f}x the model"
        for node_id in alive_nodes():  # each node cache holds the model
            assert _load_cached(template.format(node_id=node_id), index).keys() == want.keys()

        assert release_shared(url, cache_dir=template) == 3
        http_server.reset_counters()
        again = ray.get([r.shared_cached.remote(url, template) for r in replicas], timeout=300)
        assert all(got.get("digests") == want for got in again), again
        _only_probes(http_server)
        assert http_server.bytes_sent < size * 0.01, http_server.bytes_sent
    finally:
        release_shared(url, cache_dir=template)
        for replica in replicas:
            ray.kill(replica)
    assert stop_agents() == 3
    _wait_for("no agent left", lambda: not any(_agents_of(n) for n in alive_nodes()))
    assert stop_agents() == 0


def test_a_killed_agent_is_replaced_on_the_next_load_shared(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    _swarm()
    first = model(http_server.root / "a", megabytes=4, seed=12)
    second = model(http_server.root / "b", megabytes=4, seed=13)
    url_a = http_server.url_for("a/model.safetensors.index.json")
    url_b = http_server.url_for("b/model.safetensors.index.json")
    template = str(tmp_path / "k-{node_id}")
    node = alive_nodes()[1]
    replica = Replica.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    ).remote()
    try:
        got = ray.get(replica.shared_cached.remote(url_a, template), timeout=300)
        assert got.get("digests") == _reference(first), got
        [name] = _agents_of(node)
        ray.kill(ray.get_actor(name, namespace="aioloader"))
        _wait_for("the agent gone", lambda: name not in _agents_of(node))
        got = ray.get(replica.shared_cached.remote(url_b, template), timeout=300)
        assert got.get("digests") == _reference(second) and not got["warnings"], got
        assert _agents_of(node) and name not in _agents_of(node)  # a new agent
    finally:
        release_shared(url_a, cache_dir=template)
        release_shared(url_b, cache_dir=template)
        ray.kill(replica)


def test_two_models_shared_at_once(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    _swarm()
    # Two models with no file alike (their indexes differ too).
    files_a = model(http_server.root / "a", megabytes=8, seed=14)
    files_b = model(http_server.root / "b", megabytes=6, seed=15)
    urls = [http_server.url_for(f"{m}/model.safetensors.index.json") for m in "ab"]
    size = sum(
        _sizes(f, http_server.root / m / "model.safetensors.index.json")
        for f, m in ((files_a, "a"), (files_b, "b"))
    )
    template = str(tmp_path / "two-{node_id}")
    replicas = _on_every_node()
    http_server.reset_counters()
    try:
        runs = [r.shared_cached.remote(u, template) for u in urls for r in replicas]
        got = ray.get(runs, timeout=300)
        assert all(g.get("digests") == _reference(files_a) for g in got[:3]), got[:3]
        assert all(g.get("digests") == _reference(files_b) for g in got[3:]), got[3:]
        assert not any(g["warnings"] for g in got), got
        assert http_server.bytes_sent <= size * 1.05, http_server.bytes_sent / size
    finally:
        for url in urls:
            release_shared(url, cache_dir=template)
        for replica in replicas:
            ray.kill(replica)


def test_load_shared_without_the_swarm_warns_and_loads_alone(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """The swarm cannot listen (its port is taken): every node pulls its own copy,
    a warning says what it costs, the tensors are right; share=True fails instead."""
    import socket

    _swarm()
    stop_agents()  # agents already running would share on their own ports
    files = model(http_server.root / "m", megabytes=4, seed=16)
    url = http_server.url_for("m/model.safetensors.index.json")
    want = _reference(files)
    host = ray.nodes()[0]["NodeManagerAddress"]
    replicas = _on_every_node()
    template = str(tmp_path / "w-{node_id}")
    try:
        with socket.socket() as taken:
            taken.bind((host, 0))
            taken.listen()
            port = taken.getsockname()[1]
            held = {"swarm_port": port}
            got = ray.get([r.shared_cached.remote(url, template, held) for r in replicas])
            for one in got:
                assert one.get("digests") == want, one
                [said] = one["warnings"]
                assert "cannot share the download" in said and f"{port}" in said, said
                assert "pulls its own copy" in said and "1x the model more" in said, said
            strict = ray.get(
                replicas[0].shared_cached.remote(
                    url, str(tmp_path / "s-{node_id}"), {**held, "share": True}
                )
            )
            assert "share=True" in strict.get("error", ""), strict
    finally:
        release_shared(url, cache_dir=template)
        release_shared(url, cache_dir=str(tmp_path / "s-{node_id}"))
        for replica in replicas:
            ray.kill(replica)
    assert not any(_agents_of(n) for n in alive_nodes())  # none kept that cannot share


@pytest.mark.parametrize(
    "options",
    [
        {"share": "yes"}, {"share": 1}, {"share": 0}, {"share": ""}, {"share": [True]},
        {"swarm_port": -1}, {"swarm_port": 65536}, {"swarm_port": 10**100},
        {"swarm_port": True}, {"swarm_port": "6881"}, {"swarm_port": 1.5},
        {"swarm_port": None}, {"swarm_port": float("nan")},
        {"cache_dir": ""}, {"cache_dir": 7}, {"cache_dir": "/c/{node}"}, {"cache_dir": "/c/{"},
        {"cache_dir": "/c/" + "{node_id}" * 10**5 + "{x}"},
    ],
)  # fmt: skip
def test_load_shared_refuses_unusable_sharing_options(
    cluster: dict[str, Any], options: Any
) -> None:
    import asyncio

    from aioloader import ConfigError

    before = ray.util.list_named_actors(all_namespaces=True)
    with pytest.raises(ConfigError, match=next(iter(options))) as info:
        asyncio.run(load_shared("http://127.0.0.1:9/m.safetensors", **options))
    assert len(str(info.value)) < 2000
    assert ray.util.list_named_actors(all_namespaces=True) == before


def _holders() -> list[str]:
    """The names of load_shared's holders alive now."""
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "aioloader" and a["name"].startswith("aioloader-shared-")
    ]


def test_release_shared_returns_once_its_holders_are_gone(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """``ray.kill`` returns before the actor's name is free, and a load then found the
    stopped holder by its name and failed ("killed by ray.kill"): the release waits."""
    files = model(http_server.root / "rel", megabytes=2, seed=21)
    url = http_server.url_for("rel/model.safetensors.index.json")
    template = str(tmp_path / "rel-{node_id}")
    others = set(_holders())  # the other tests' holders
    replicas = _on_every_node()
    try:
        first = ray.get([r.shared_cached.remote(url, template) for r in replicas], timeout=300)
        assert all(got.get("digests") == _reference(files) for got in first), first
        assert len(set(_holders()) - others) == 3
        assert release_shared(url, cache_dir=template) == 3
        assert not set(_holders()) - others
    finally:
        release_shared(url, cache_dir=template)
        for replica in replicas:
            ray.kill(replica)
        stop_agents()


def test_a_holder_killed_during_its_load_is_replaced(
    cluster: dict[str, Any], http_server: FaultyHttpServer, tmp_path: Path
) -> None:
    """A holder stopped while callers wait for it (``release_shared`` elsewhere, a crash)
    does not fail them: a new holder loads, once the stopped one's name is free."""
    files = model(http_server.root / "kill", megabytes=2, seed=22)
    url = http_server.url_for("kill/model.safetensors.index.json")
    template = str(tmp_path / "kill-{node_id}")
    http_server.stall(None, 3.0, before_headers=True, count=2)  # the load waits a while
    others = set(_holders())  # the other tests' holders
    replica = Replica.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(alive_nodes()[0], soft=False)
    ).remote()
    try:
        waiting = replica.shared_cached.remote(url, template)
        _wait_for("its holder", lambda: set(_holders()) - others)
        [name] = set(_holders()) - others
        ray.kill(ray.get_actor(name, namespace="aioloader"))
        got = ray.get(waiting, timeout=300)
        assert got.get("digests") == _reference(files), got
    finally:
        release_shared(url, cache_dir=template)
        ray.kill(replica)
        stop_agents()

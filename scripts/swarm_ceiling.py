"""libtorrent alone on the fleet benchmark's network: the pace the swarm's engine keeps.

    python scripts/swarm_ceiling.py --nodes 8 --size-mib 256                  # defaults
    python scripts/swarm_ceiling.py --nodes 8 --size-mib 256 --shares --rqt 1  # as the daemon

One node seeds one v2 torrent of ``--size-mib`` random bytes (1 MiB pieces); every other
node downloads it from all the others at once, each in its own network namespace, links
shaped with ``tc`` as in scripts/fleet_bench.py (root and ``ip netns`` needed). No
aioloader code moves a byte: this is the ceiling a follower of scripts/fleet_bench.py
can reach on the same machine. ``--shares``: downloader i of n asks for the i-th n-th of
the pieces first, as the daemon's followers do; ``--rqt``: libtorrent's
``request_queue_time`` (the daemon uses 1). Prints each downloader's time, the slowest
one's MB/s and how many copies of the file left the seed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from fleet_netns import Namespaces, namespaces_work  # noqa: E402

PORT = 6881


def _node(args: argparse.Namespace) -> None:
    """One node: seed or download, report when whole, seed until told to stop."""
    import libtorrent as lt

    settings: dict[str, object] = {
        "listen_interfaces": f"{args.host}:{PORT}",
        "outgoing_interfaces": args.host,
        "enable_dht": False, "enable_lsd": False, "enable_upnp": False, "enable_natpmp": False,
        "enable_outgoing_utp": False, "enable_incoming_utp": False,
        "allow_multiple_connections_per_ip": True, "alert_mask": 0,
    }  # fmt: skip
    if args.rqt:
        settings["request_queue_time"] = args.rqt
    for item in args.set or ():
        name, _, value = item.partition("=")
        settings[name] = int(value) if value.lstrip("-").isdigit() else value
    session = lt.session(settings)  # type: ignore[call-overload]
    info = lt.torrent_info(Path(args.torrent).read_bytes())
    params = lt.add_torrent_params()
    params.ti, params.save_path = info, args.folder
    if args.share is None:
        params.flags = lt.torrent_flags.seed_mode
    handle = session.add_torrent(params)
    if args.share is not None and args.shares:
        i, n = args.share
        pieces = info.num_pieces()
        first, last = i * pieces // n, (i + 1) * pieces // n
        handle.prioritize_pieces([7 if first <= p < last else 4 for p in range(pieces)])
    time.sleep(0.5)  # every node listening
    for peer in args.peers.split(","):
        host, _, port = peer.rpartition(":")
        if host != args.host:
            handle.connect_peer((host, int(port)))
    started, reported = time.monotonic(), args.share is None
    stop = Path(args.folder).parent / "stop"
    while not stop.exists():
        if not reported and handle.status().is_seeding:
            print(json.dumps({"seconds": round(time.monotonic() - started, 2)}), flush=True)
            reported = True
        time.sleep(0.05)
    print(json.dumps({"uploaded": handle.status().total_payload_upload}), flush=True)


def _run(args: argparse.Namespace) -> int:
    import libtorrent as lt

    why = namespaces_work()
    if why:
        print(f"swarm_ceiling needs network namespaces: {why}", file=sys.stderr)
        return 2
    size = args.size_mib << 20
    work = Path(tempfile.mkdtemp(prefix="swarm-ceiling-"))
    net = None
    try:
        seed = work / "n0"
        seed.mkdir()
        with (seed / "blob").open("wb") as out:
            for _ in range(args.size_mib):
                out.write(os.urandom(1 << 20))
        creator = lt.create_torrent([lt.create_file_entry("blob", size)], 1 << 20,
                                    lt.create_torrent.v2_only)  # fmt: skip
        creator.set_priv(True)
        lt.set_piece_hashes(creator, str(seed))
        torrent = work / "blob.torrent"
        torrent.write_bytes(lt.bencode(creator.generate()))
        net = Namespaces(args.nodes, int(args.rate_mb * 1e6))
        hosts = [net.host_of(i) for i in range(args.nodes)]
        peers = ",".join(f"{h}:{PORT}" for h in hosts)
        procs = []
        for i, host in enumerate(hosts):
            folder = work / f"n{i}"
            folder.mkdir(exist_ok=True)
            cmd = [sys.executable, __file__, "--node", "--host", host, "--torrent", str(torrent),
                   "--folder", str(folder), "--peers", peers, "--rqt", str(args.rqt)]  # fmt: skip
            cmd += [f"--set={item}" for item in args.set or ()]
            if i:
                cmd += ["--share", str(i - 1), str(args.nodes - 1)]
                cmd += ["--shares"] if args.shares else []
            procs.append(subprocess.Popen([*net.wrap(i), *cmd], stdout=subprocess.PIPE, text=True))
        times = [json.loads(p.stdout.readline())["seconds"] for p in procs[1:]]  # type: ignore[union-attr]
        (work / "stop").touch()
        uploaded = json.loads(procs[0].stdout.readline())["uploaded"]  # type: ignore[union-attr]
        for p in procs:
            p.wait(timeout=30)
        shares = "on" if args.shares else "off"
        print(f"{args.nodes} nodes, {args.size_mib} MiB, {args.rate_mb:g} MB/s links, "
              f"shares={shares}, request_queue_time={args.rqt or 3}")  # fmt: skip
        print("settings:", " ".join(args.set or ["libtorrent's"]))
        print("downloaders' seconds:", " ".join(f"{t:.1f}" for t in sorted(times)))
        print(f"slowest {max(times):.1f} s: {size / max(times) / 1e6:.1f} MB/s per downloader; "
              f"the seed sent {uploaded / size:.2f}x the file")  # fmt: skip
        return 0
    finally:
        if net is not None:
            net.close()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--rate-mb", type=float, default=40, help="MB/s per link each way")
    p.add_argument("--shares", action="store_true", help="downloaders ask for a share first")
    p.add_argument("--rqt", type=int, default=0, help="request_queue_time (0: libtorrent's)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="a libtorrent setting")
    p.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--host", help=argparse.SUPPRESS)
    p.add_argument("--torrent", help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--peers", help=argparse.SUPPRESS)
    p.add_argument("--share", type=int, nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.node:
        _node(args)
        return 0
    if args.nodes < 2 or args.size_mib < 1 or args.rate_mb <= 0:
        p.error("--nodes >= 2, --size-mib >= 1, --rate-mb > 0")
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())

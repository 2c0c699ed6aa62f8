"""The libtorrent settings of the daemon's swarm session (session.py)."""

from __future__ import annotations

from .torrents import libtorrent

__all__ = ["settings_pack"]


def settings_pack(host: str, port: int, rate: int) -> dict[str, str | int | bool]:
    """The session's settings: listening on ``host:port`` only, private (no DHT, local
    discovery, UPnP or NAT-PMP), TCP only (µTP held peers to a few MB/s), every torrent
    active, ``rate`` bytes per second each way (0: no cap)."""
    lt = libtorrent()
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    settings: dict[str, str | int | bool] = {
        "listen_interfaces": listen,
        "enable_dht": False,
        "enable_lsd": False,
        "enable_upnp": False,
        "enable_natpmp": False,
        "enable_outgoing_utp": False,
        "enable_incoming_utp": False,
        "allow_multiple_connections_per_ip": True,
        "active_downloads": -1,
        "active_seeds": -1,
        "active_limit": -1,
        # Every connection unchoked, and room for one per torrent and peer: a node of a
        # split seeds a range torrent per range it pulled to every other node (8 nodes,
        # 8 files in 8 ranges: 56 of them). libtorrent's 8 unchoke slots and 200
        # connections left most of them choked for longer than the stall time, and a
        # range stalled "no piece for 30 s" was read from the origin again (4.3x).
        "unchoke_slots_limit": -1,
        "connections_limit": 8192,
        "peer_connect_timeout": 3,
        # A peer that refused (it had not added the torrent yet: followers add a range
        # torrent as its owner lists it, each in its own time) is dialled again by the
        # download every 2 s (download.py); libtorrent's own wait before dialling it
        # again, asked to or not, is 60 s times its failures: a follower sat at "0 of 1
        # peers connected" for a minute after the seed was there.
        "min_reconnect_time": 1,
        "enable_ip_notifier": False,
        "max_retry_port_bind": 0,  # the port asked for, or an error
        "listen_system_port_fallback": False,
        "alert_mask": lt.alert_category.error
        | lt.alert_category.status
        | lt.alert_category.peer
        | lt.alert_category.ip_block
        | lt.alert_category.storage,
        # Requests queued per peer: a second's worth, not three. Fewer requests waiting
        # at the node that pulls from the origin, fewer pieces it sends twice (8 nodes,
        # 40 MB/s links, 256 MiB: 1.3x the file out of it, not 1.5x; 9.5 s, not 11).
        "request_queue_time": 1,
        "upload_rate_limit": rate,
        "ignore_limits_on_local_network": False,  # a cluster's peers are all local
        "download_rate_limit": rate,
    }
    if host not in ("0.0.0.0", "::"):
        settings["outgoing_interfaces"] = host  # peers see this address, as the filter does
    return settings

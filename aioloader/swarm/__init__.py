"""Daemons sharing models over BitTorrent (libtorrent): one origin download per cluster.

- ``rendezvous.py``: which node pulls a model from the origin (pure).
- ``peers.py``: the ``--peers`` list, parsed and resolved.
- ``manifest.py``: the JSON a daemon offers per model, and its checks (a peer may lie).
- ``torrents.py``, ``session.py``: libtorrent (imported there only, when a swarm runs).
- ``source.py``: a model's files read from the swarm, the origin behind it.
- ``coordinator.py``: per model, whom to follow or whether to pull from the origin.

See docs/swarm.md.
"""

"""Daemons sharing models over BitTorrent (libtorrent): one origin download per cluster.

- ``rendezvous.py``: which node pulls a model from the origin (pure).
- ``peers.py``: the ``--peers`` list, parsed and resolved.
- ``manifest.py``: the JSON a daemon offers per model, and its checks (a peer may lie).
- ``torrents.py``, ``session.py``: libtorrent (imported there only, when a swarm runs).
- ``source.py``: a model's files read from the swarm, the origin behind it.
- ``proof.py``, ``asking.py``: peers prove they hold the token, both ways, without
  sending it; asking a peer about a model (304 when its manifest did not change).
- ``admission.py``: the swarm's IP filter (resolved and proven peers).
- ``offers.py``: the manifests and seeded files this node offers.
- ``coordinator.py``: per model, whom to follow or whether to pull from the origin.

See docs/swarm.md.
"""

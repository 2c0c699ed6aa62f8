"""Ray: preload every node's cache, and one host copy of a model per node (preload.py,
shared.py).

An optional extra (``pip install "aioloader[ray]"``), built on Ray's own parts:
actors, node-affinity scheduling and the object store.

* Inside an async actor, ``await aioloader.load_model(url)`` works as anywhere
  else: the load runs on the actor's event loop, whose other calls keep being
  answered, and files and locks go with the process if the actor is killed.
* ``preload(urls, cache_dir=...)`` fills the node cache of every alive node (or
  of the nodes given) with one agent actor per node, pinned there by
  ``NodeAffinitySchedulingStrategy(soft=False)``. Each agent runs the node's daemon
  (``aioloader serve``'s ``Server``) in its process, with a token made for the
  preload; the driver gathers their addresses through Ray and gives each agent the
  others as its peers, then all fetch at once through the daemon's swarm: the origin
  sends about one copy for the cluster (docs/ray.md). A node without libtorrent
  pulls its own copy, and a warning says what that costs. It returns one
  ``NodePreload`` per node, failures included. Running it again finds the files
  cached.
* ``load_shared(url)`` gives an actor the model's tensors from a holder actor on
  its own node, which loaded them once into Ray's object store: N replicas on a
  node read the model once and map the same host memory (zero-copy, read-only).
  A holder serves one URL with one set of options (selection, rows, credentials,
  limits): callers that ask differently get holders of their own, named after a
  digest of what they asked, so no secret shows in an actor's name. The holders on
  several nodes share one download: each has its node's agent (one per node, found
  through a registry actor; agents.py) fetch the model into the node cache through
  the swarm first. ``stop_agents()`` stops those agents.
"""

from .agents import stop_agents
from .preload import NodePreload, preload
from .shared import load_shared, release_shared

__all__ = ["NodePreload", "load_shared", "preload", "release_shared", "stop_agents"]

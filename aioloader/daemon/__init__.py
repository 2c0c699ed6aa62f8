"""``aioloader serve``: a node-local daemon that keeps models in the cache.

``config.py`` reads the settings (``auth.py`` the token), ``state.py`` keeps the
registry of models, ``downloads.py`` runs the cache fetches under one TaskGroup
(``pins.py`` holds the preloads against eviction), ``priority.py`` orders those
waiting for a download slot, ``bandwidth.py`` caps the bytes per second they share
(``--max-bandwidth``), ``metrics.py`` exports Prometheus metrics, ``app.py`` holds
the HTTP routes, ``connections.py`` the cap and deadlines of client connections,
``logs.py`` keeps clients' text from forging log lines, and ``server.py`` the life
cycle (startup, signals, graceful shutdown). Nothing here is imported by
``import aioloader``.
"""

from __future__ import annotations

from .config import DaemonConfig

__all__ = ["DaemonConfig"]

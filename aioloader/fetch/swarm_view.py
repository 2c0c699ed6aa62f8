"""``aioloader swarm view --daemon URL``: the cluster's view, as one daemon gathers it
(``GET /v1/swarm/view?cluster=1``: its own and every peer's, swarm/view.py), printed as
a table per model with a line per node that is not done saying why, where the view
tells (swarm/diagnosis.py), or as JSON (``--json``). The daemon's URL and token are
read as ``aioloader fetch --daemon`` reads them (daemon_flags.py).

The daemon's answer is checked as a peer's is (``parse_cluster``): a wrong shape fails
the command, naming the daemon; impossible numbers are shown as reported, flagged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..errors import ConfigError, SourceError
from ..redact import redact
from ..swarm.diagnosis import render
from ..swarm.view import ClusterView, ViewError, parse_cluster
from .daemon_flags import add_arguments, daemon_of

__all__ = ["add_parser", "ask", "main"]

MAX_ANSWER = 64 << 20  # bytes of the daemon's answer read at most
TIMEOUT = 60.0  # seconds the daemon's answer may take (it bounds each peer's itself)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``aioloader swarm view`` on the command line's subparsers ``sub``."""
    swarm = sub.add_parser("swarm", parents=[common], help="look at the daemons' swarm")
    commands = swarm.add_subparsers(dest="swarm_command", required=True)
    view = commands.add_parser(
        "view",
        parents=[common],
        help="per model, which node holds, pulls or follows which file, at what rate",
        description="Asks one daemon for the cluster's view (it asks every peer at once) "
        "and prints a table per model: node, file, role, done, rate, bytes from the origin "
        "and from peers; and for each node that is not done, why, where the view tells "
        "(docs/swarm.md, 'Seeing the cluster').",
    )
    add_arguments(view, wait=False, daemon="any daemon of the cluster, http://HOST:PORT")
    view.add_argument("--json", action="store_true", help="print the view as JSON")


async def ask(daemon: str, token: str | None, wait: float = TIMEOUT) -> ClusterView:
    """The cluster's view as the daemon at ``daemon`` gathers it, within ``wait``
    seconds, checked.

    Raises:
        SourceError: no answer, a refusal, or not a view (naming the daemon).
    """
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    target = f"{daemon}/v1/swarm/view?cluster=1"
    chunks: list[bytes] = []
    total = 0
    try:
        async with (
            asyncio.timeout(wait),
            aiohttp.ClientSession() as client,
            client.get(target, headers=headers) as response,
        ):
            status = response.status
            async for chunk in response.content.iter_any():
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_ANSWER:
                    break
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise SourceError(
            f"the daemon at {daemon} did not answer ({str(exc) or type(exc).__name__}); "
            "is `aioloader serve` running there?"
        ) from None
    if total > MAX_ANSWER:
        raise SourceError(f"the daemon at {daemon} answered over {MAX_ANSWER} bytes")
    try:
        doc: object = json.loads(b"".join(chunks))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SourceError(f"the daemon at {daemon} answered HTTP {status}, not JSON") from None
    if status != 200:
        detail = doc.get("detail") if isinstance(doc, dict) else None
        hint = "; give its token with --token or --token-file" if status == 401 else ""
        raise SourceError(f"the daemon at {daemon} answered {status}: {detail!s:.500}{hint}")
    try:
        return parse_cluster(doc, f"the daemon at {daemon}")
    except ViewError as exc:
        raise SourceError(str(exc)) from None


async def main(args: argparse.Namespace) -> int:
    daemon, token = daemon_of(args)
    if daemon is None:
        raise ConfigError("name a daemon of the cluster: --daemon http://HOST:PORT")
    cluster = await ask(daemon, token)
    if args.json:
        print(json.dumps(cluster.as_dict(), indent=2))
    else:
        for line in render(cluster):
            print(redact(line))
    sys.stdout.flush()
    return 0

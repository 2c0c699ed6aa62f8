"""The network of the fleet benchmark: network namespaces shaped with ``tc``, or loopback.

``Namespaces(n, rate, mtu)``: a bridge in this namespace holding the origin's address
(10.77.0.1), and per node a namespace of its own with a veth pair to the bridge and
the address 10.77.0.(10+i); ``tc`` (a token bucket) shapes each node's link both
ways at ``rate`` bytes per second: the host end's egress is what the node receives
(from the origin and from its peers), the node end's what it sends. Everything it
creates carries this process's id in its name and is removed by ``close()``, which
the benchmark calls on every way out (an error, Ctrl-C, SIGTERM). ``mtu`` is every
link's (1500: Ethernet's; 9001 is what EC2 gives inside a VPC): the kernel's work per
byte on these links is per packet, and on 2 MB/s links TCP sends one segment a packet
(its segments are sized to about a millisecond at the pace it measures), so at 32 nodes
the packets of 1500 bytes took a third of the two vCPUs in softirq.

``Loopback(n, rate)``: the nodes on 127.0.0.(10+i) and the origin on 127.0.0.1,
shaped only by the daemon's own ``--max-bandwidth`` (what it downloads from the
origin; the swarm's traffic between peers needs the daemon's own rate limit).
"""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["Loopback", "Namespaces", "namespaces_work"]

SUBNET = "10.77.0"


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


def namespaces_work() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "`ip` or `tc` is missing (apt-get install iproute2)"
    name = f"flprobe{os.getpid()}"
    made = _run("ip", "netns", "add", name, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _run("ip", "netns", "delete", name, check=False)
    return None


class Loopback:
    """Nodes on 127.0.0.(10+i); the rate goes to each daemon as --max-bandwidth."""

    kind = "loopback"
    origin_host = "127.0.0.1"

    def __init__(self, n: int, rate: int, mtu: int = 1500) -> None:
        if not 1280 <= mtu <= 65535:
            raise ValueError(f"mtu {mtu} is not from 1280 to 65535")
        self.n = n
        self.rate = rate
        self.mtu = mtu

    def host_of(self, i: int) -> str:
        return f"127.0.0.{10 + i}"

    def wrap(self, i: int) -> list[str]:
        return []

    ports = None  # free ones, picked on loopback

    def daemon_args(self) -> list[str]:
        return ["--max-bandwidth", str(self.rate)] if self.rate else []

    def node_of_client(self, address: str) -> int | None:
        return None  # every node reaches the origin from 127.0.0.1

    def close(self) -> None:
        pass

    def describe(self) -> str:
        limit = f"{self.rate / 1e6:g} MB/s per node from the origin (--max-bandwidth)"
        return f"loopback 127.0.0.x, {limit if self.rate else 'no rate limit'}"


class Namespaces:
    """See the module docstring; ``n`` nodes, ``rate`` bytes/s per link (0: unshaped)."""

    kind = "netns"
    origin_host = f"{SUBNET}.1"

    def __init__(self, n: int, rate: int, mtu: int = 1500) -> None:
        if not 1280 <= mtu <= 65535:
            raise ValueError(f"mtu {mtu} is not from 1280 to 65535")
        self.n = n
        self.rate = rate
        self.mtu = mtu
        self.tag = f"fl{os.getpid() % 100000}"
        self.bridge = f"{self.tag}br"
        self.spaces: list[str] = []
        self.links: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _run("ip", "link", "add", self.bridge, "mtu", str(self.mtu), "type", "bridge")
        self.links.append(self.bridge)
        _run("ip", "addr", "add", f"{self.origin_host}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            space, host_end, node_end = f"{self.tag}n{i}", f"{self.tag}h{i}", f"{self.tag}v{i}"
            _run("ip", "netns", "add", space)
            self.spaces.append(space)
            _run(
                "ip", "link", "add", host_end, "mtu", str(self.mtu), "type", "veth",
                "peer", "name", node_end, "mtu", str(self.mtu),
            )  # fmt: skip
            self.links.append(host_end)
            _run("ip", "link", "set", node_end, "netns", space)
            _run("ip", "link", "set", host_end, "master", self.bridge)
            _run("ip", "link", "set", host_end, "up")
            inside = ["ip", "netns", "exec", space]
            _run(*inside, "ip", "addr", "add", f"{self.host_of(i)}/24", "dev", node_end)
            _run(*inside, "ip", "link", "set", node_end, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            if self.rate:
                self._shape([], host_end)
                self._shape(inside, node_end)

    def _shape(self, prefix: list[str], link: str) -> None:
        bits = max(8, self.rate * 8 // 1000)  # kbit/s
        burst = max(64 * 1024, self.rate // 50)  # 20 ms at the rate; enough for any HZ
        _run(
            *prefix, "tc", "qdisc", "replace", "dev", link, "root", "tbf",
            "rate", f"{bits}kbit", "burst", str(burst), "latency", "100ms",
        )  # fmt: skip

    def host_of(self, i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    def wrap(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.spaces[i]]

    def ports(self, i: int) -> tuple[int, int]:
        """Fixed ports under the ephemeral range: each node has a namespace of its own, and
        a free port asked for on the host's loopback may be the local end of a connection
        a killed daemon left behind in the node's namespace ("address already in use" when
        the next fleet starts there)."""
        return 8470, 8471

    def daemon_args(self) -> list[str]:
        return []

    def node_of_client(self, address: str) -> int | None:
        prefix = f"{SUBNET}."
        if address.startswith(prefix):
            i = int(address[len(prefix) :]) - 10
            return i if 0 <= i < self.n else None
        return None

    def close(self) -> None:
        """Remove every namespace and link made (their veth ends go with them)."""
        for space in reversed(self.spaces):
            _run("ip", "netns", "delete", space, check=False)
        for link in reversed(self.links):
            _run("ip", "link", "delete", link, check=False)
        self.spaces.clear()
        self.links.clear()

    def describe(self) -> str:
        shaped = f"tc tbf {self.rate / 1e6:g} MB/s each way" if self.rate else "unshaped"
        return f"{self.n} network namespaces on bridge {self.bridge}, {shaped}, MTU {self.mtu}"

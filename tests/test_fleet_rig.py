"""The fleet benchmark's network rig (scripts/fleet_netns.py) as the benchmark uses it.

A 32-node cold start left connections behind in the nodes' namespaces; the next fleet
of the same run asked the host's loopback for free ports, and one of them was the local
end of such a connection in node 21's namespace: "address already in use", and the run
stopped before its one-file scenario.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .fleet import Fleet

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from fleet_netns import Loopback, Namespaces, namespaces_work

_WHY = namespaces_work()


@pytest.mark.skipif(_WHY is not None, reason=f"needs network namespaces: {_WHY}")
def test_a_namespace_nodes_ports_lie_outside_its_ephemeral_range(tmp_path: Path) -> None:
    rig = Namespaces(2, 0)
    try:
        for i in range(2):
            text = subprocess.run(
                [*rig.wrap(i), "cat", "/proc/sys/net/ipv4/ip_local_port_range"],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            low = int(text.split()[0])
            port, swarm_port = rig.ports(i)
            assert port != swarm_port
            assert 1024 <= port < low and 1024 <= swarm_port < low, (i, port, swarm_port, low)
        fleet = Fleet(2, tmp_path, host_of=rig.host_of, wrap=rig.wrap, ports=rig.ports)
        assert [(n.port, n.swarm_port) for n in fleet.nodes] == [rig.ports(0), rig.ports(1)]
    finally:
        rig.close()


def test_loopback_nodes_get_free_ports_each(tmp_path: Path) -> None:
    rig = Loopback(3, 0)
    fleet = Fleet(3, tmp_path, host_of=rig.host_of, wrap=rig.wrap, ports=rig.ports)
    ports = [p for n in fleet.nodes for p in (n.port, n.swarm_port)]
    assert all(p > 0 for p in ports)
    assert len({(n.host, n.port) for n in fleet.nodes}) == 3

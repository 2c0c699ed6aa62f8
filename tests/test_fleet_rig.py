"""The fleet benchmark's network rig (scripts/fleet_netns.py) as the benchmark uses it.

A 32-node cold start left connections behind in the nodes' namespaces; the next fleet
of the same run asked the host's loopback for free ports, and one of them was the local
end of such a connection in node 21's namespace: "address already in use", and the run
stopped before its one-file scenario.
"""

from __future__ import annotations

import json
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


_RECEIVE = """
import socket, sys
server = socket.create_server((sys.argv[1], 9555))
print("ready", flush=True)
connection, _ = server.accept()
total = 0
while chunk := connection.recv(1 << 20):
    total += len(chunk)
print(total, flush=True)
"""
_SEND = """
import socket, sys
with socket.create_connection((sys.argv[1], 9555)) as connection:
    connection.sendall(bytes(int(sys.argv[2])))
"""


def _mean_packet(rig: Namespaces, size: int) -> float:
    """Send ``size`` bytes over TCP from node 0 to node 1; the mean packet at node 0's
    shaped link (its tbf's counts)."""
    receiver = subprocess.Popen(
        [*rig.wrap(1), sys.executable, "-c", _RECEIVE, rig.host_of(1)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert receiver.stdout is not None
    try:
        assert receiver.stdout.readline().strip() == "ready"
        subprocess.run(
            [*rig.wrap(0), sys.executable, "-c", _SEND, rig.host_of(1), str(size)],
            check=True, timeout=30,
        )  # fmt: skip
        assert int(receiver.stdout.readline()) == size
    finally:
        receiver.kill()
        receiver.wait()
        receiver.stdout.close()
    shown = subprocess.run(
        [*rig.wrap(0), "tc", "-s", "-j", "qdisc", "show", "dev", f"{rig.tag}v0"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    tbf = next(q for q in json.loads(shown) if q["kind"] == "tbf")
    assert tbf["bytes"] >= size
    return float(tbf["bytes"] / tbf["packets"])


@pytest.mark.skipif(_WHY is not None, reason=f"needs network namespaces: {_WHY}")
@pytest.mark.parametrize(("mtu", "low", "high"), [(1500, 1000, 1600), (9001, 6000, 9100)])
def test_a_shaped_link_carries_packets_of_its_mtu(mtu: int, low: int, high: int) -> None:
    # At 2 MB/s TCP sends a segment a packet (it sizes them to its measured pace), so a
    # link's MTU sets how many packets the kernel handles per byte: six times fewer at 9001.
    rig = Namespaces(2, 2_000_000, mtu)
    try:
        assert low < _mean_packet(rig, 1_500_000) < high
        assert f"MTU {mtu}" in rig.describe()
    finally:
        rig.close()


@pytest.mark.parametrize("mtu", [0, 576, 1279, 65536, 10**9])
def test_an_mtu_out_of_range_is_refused_before_anything_is_made(mtu: int) -> None:
    with pytest.raises(ValueError, match=f"mtu {mtu} is not from 1280 to 65535"):
        Namespaces(2, 0, mtu)

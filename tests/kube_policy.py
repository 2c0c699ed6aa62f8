"""What Kubernetes would make of deploy/'s pods and NetworkPolicy, without a cluster.

``pod_security_violations`` applies the Pod Security Standards (baseline and
restricted, as the built-in admission controller checks them) to a pod spec;
``allows`` answers whether a NetworkPolicy lets one connection through, with the
API's semantics for selectors, peers, ports and IP blocks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

__all__ = ["allows", "pod_security_level", "pod_security_violations", "selects"]

LEVELS = ("restricted", "baseline", "privileged")
_BASELINE_CAPABILITIES = frozenset(
    [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ]
)
_SAFE_SYSCTLS = frozenset(
    [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    ]
)
_SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
_RESTRICTED_VOLUMES = frozenset(
    [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ]
)


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(kind) or ()


def _baseline(pod: dict[str, Any]) -> Iterator[str]:
    pod_security = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            yield f"pod: {field}"
    for volume in pod.get("volumes") or ():
        if "hostPath" in volume:
            yield f"volume {volume['name']}: hostPath"
    for sysctl in pod_security.get("sysctls") or ():
        if sysctl["name"] not in _SAFE_SYSCTLS:
            yield f"pod: sysctl {sysctl['name']}"
    contexts = [("pod", pod_security)]
    contexts += [
        (f"container {c['name']}", c.get("securityContext") or {}) for c in _containers(pod)
    ]
    for who, context in contexts:
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"{who}: seccomp Unconfined"
        if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
            yield f"{who}: AppArmor Unconfined"
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in _SELINUX_TYPES or {"user", "role"} & set(selinux):
            yield f"{who}: SELinux options"
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            yield f"{who}: hostProcess"
    for container in _containers(pod):
        who = f"container {container['name']}"
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            yield f"{who}: privileged"
        added = set((context.get("capabilities") or {}).get("add") or ())
        if added - _BASELINE_CAPABILITIES:
            yield f"{who}: adds {sorted(added - _BASELINE_CAPABILITIES)}"
        if context.get("procMount", "Default") != "Default":
            yield f"{who}: procMount"
        if any(port.get("hostPort") for port in container.get("ports") or ()):
            yield f"{who}: hostPort"


def _restricted(pod: dict[str, Any]) -> Iterator[str]:
    pod_security = pod.get("securityContext") or {}
    for volume in pod.get("volumes") or ():
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            yield f"volume {volume['name']}: {sorted(kinds)}"
    if pod_security.get("runAsUser") == 0:
        yield "pod: runAsUser 0"
    for container in _containers(pod):
        who = f"container {container['name']}"
        context = container.get("securityContext") or {}

        def setting(name: str, context: dict[str, Any] = context) -> Any:
            return context.get(name, pod_security.get(name))

        if context.get("allowPrivilegeEscalation") is not False:
            yield f"{who}: allowPrivilegeEscalation is not false"
        if setting("runAsNonRoot") is not True:
            yield f"{who}: runAsNonRoot is not true"
        if context.get("runAsUser") == 0:
            yield f"{who}: runAsUser 0"
        if (setting("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            yield f"{who}: seccomp neither RuntimeDefault nor Localhost"
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or ()):
            yield f"{who}: does not drop ALL capabilities"
        if set(capabilities.get("add") or ()) - {"NET_BIND_SERVICE"}:
            yield f"{who}: adds {sorted(set(capabilities['add']) - {'NET_BIND_SERVICE'})}"


def pod_security_violations(pod: dict[str, Any], level: str) -> list[str]:
    """What of the pod spec ``pod`` the Pod Security Standards' ``level`` refuses."""
    if level == "privileged":
        return []
    found = list(_baseline(pod))
    if level == "restricted":
        found += _restricted(pod)
    return found


def pod_security_level(pod: dict[str, Any]) -> str:
    """The strictest level of the Pod Security Standards that admits ``pod``."""
    return next(level for level in LEVELS if not pod_security_violations(pod, level))


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (``{}`` selects everything) matches ``labels``."""
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for rule in selector.get("matchExpressions") or ():
        key, operator, values = rule["key"], rule["operator"], rule.get("values") or ()
        present = key in labels
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels[key] not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]:
            return False
    return True


def _peer_admits(peer: dict[str, Any], policy_namespace: str, other: dict[str, Any]) -> bool:
    if "ipBlock" in peer:
        if "ip" not in other:
            return False
        address = ipaddress.ip_address(other["ip"])
        block = peer["ipBlock"]
        inside = address in ipaddress.ip_network(block["cidr"])
        return inside and not any(
            address in ipaddress.ip_network(cidr)
            for cidr in block.get("except") or ()
            if ipaddress.ip_network(cidr).version == address.version
        )
    if "labels" not in other:  # an address outside the cluster: only IP blocks name it
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], other["namespace_labels"]):
            return False
    elif other["namespace"] != policy_namespace:
        return False
    return selects(peer.get("podSelector") or {}, other["labels"])


def _port_admits(ports: list[dict[str, Any]] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for given in ports:
        if given.get("protocol", "TCP") != protocol:
            continue
        first = given.get("port")
        if first is None or (first <= port <= given.get("endPort", first)):
            return True
    return False


def allows(
    policy: dict[str, Any],
    namespace: str,
    pod_labels: dict[str, str],
    direction: str,
    other: dict[str, Any],
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether ``policy`` (in ``namespace``) lets a connection of ``direction``
    (``"Ingress"`` or ``"Egress"``) between the pod labelled ``pod_labels`` and
    ``other`` through on ``port``. ``other`` is a pod (``namespace``,
    ``namespace_labels``, ``labels``; with ``ip`` too if known) or an address
    outside the cluster (only ``ip``). A pod the policy does not select, or a
    direction it does not govern, is not its business: allowed.
    """
    spec = policy["spec"]
    types = spec.get("policyTypes") or ["Ingress"] + (["Egress"] if "egress" in spec else [])
    if direction not in types or not selects(spec["podSelector"], pod_labels):
        return True
    side = "from" if direction == "Ingress" else "to"
    for rule in spec.get(direction.lower()) or ():
        peers = rule.get(side)
        if peers and not any(_peer_admits(peer, namespace, other) for peer in peers):
            continue
        if _port_admits(rule.get("ports"), port, protocol):
            return True
    return False

"""deploy/kubernetes/: no usable token shipped, who reaches the daemon, pod security.

scripts/deploy_check.sh validates the manifests against the API's schema; these tests
check what the schema cannot: what the cluster would admit and let through.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .kube_policy import allows, pod_security_level, pod_security_violations

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
NAMESPACE = "aioloader"
PSA = "pod-security.kubernetes.io/"


def _load(path: Path) -> dict[str, Any]:
    (doc,) = list(yaml.safe_load_all(path.read_text()))
    assert isinstance(doc, dict)
    return doc


def _daemonset() -> dict[str, Any]:
    return _load(K8S / "daemonset.yaml")


def _pod() -> dict[str, Any]:
    spec: dict[str, Any] = _daemonset()["spec"]["template"]["spec"]
    return spec


def _pod_labels() -> dict[str, str]:
    labels: dict[str, str] = _daemonset()["spec"]["template"]["metadata"]["labels"]
    return labels


def _policy() -> dict[str, Any]:
    (policy,) = [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        if (doc := _load(path)).get("kind") == "NetworkPolicy"
    ]
    return policy


def test_no_manifest_ships_a_token() -> None:
    for path in (ROOT / "deploy").rglob("*.yaml"):
        doc = _load(path)
        if doc["kind"] == "Secret":
            assert not doc.get("data") and not doc.get("stringData"), f"{path} ships a secret"
        text = path.read_text().lower()
        assert "change-me" not in text and "changeme" not in text, path
    kustomization = _load(K8S / "kustomization.yaml")
    assert "secretGenerator" not in kustomization


def test_the_token_comes_from_a_secret_the_user_makes_as_documented() -> None:
    (daemon,) = _pod()["containers"]
    env = {e["name"]: e for e in daemon["env"]}
    ref = env["AIOLOADER_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref.get("optional") is not True, "a pod without the Secret must wait, not run open"
    command = re.compile(
        rf"kubectl -n {NAMESPACE} create secret generic {ref['name']}\s+(\\\s*)?(#\s*)?"
        rf"--from-literal={ref['key']}=\"?\$\(openssl rand -hex (\d+)\)"
    )
    for path in (K8S / "kustomization.yaml", ROOT / "docs" / "kubernetes.md"):
        found = command.search(path.read_text())
        assert found, f"{path} says how to create the Secret"
        assert int(found.group(3)) >= 32, "32 random bytes at least"


def test_namespace_enforces_the_strictest_pod_security_level_the_daemonset_meets() -> None:
    namespace = _load(K8S / "namespace.yaml")
    labels = namespace["metadata"].get("labels") or {}
    pod = _pod()
    assert labels.get(PSA + "enforce") == pod_security_level(pod)
    # Only the node cache's hostPath keeps it from baseline ...
    assert pod_security_violations(pod, "baseline") == ["volume cache: hostPath"]
    # ... and the daemon itself, without the root init container that hands it the
    # hostPath, meets restricted.
    daemon_only = copy.deepcopy(pod)
    del daemon_only["initContainers"]
    daemon_only["volumes"] = [
        {"name": v["name"], "emptyDir": {}} if "hostPath" in v else v for v in pod["volumes"]
    ]
    assert pod_security_violations(daemon_only, "restricted") == []
    assert labels.get(PSA + "audit") == "restricted"


@pytest.mark.parametrize(
    ("pod", "level"),
    [
        ({"containers": [{"name": "c"}]}, "baseline"),
        ({"hostNetwork": True, "containers": [{"name": "c"}]}, "privileged"),
        ({"containers": [{"name": "c", "securityContext": {"privileged": True}}]}, "privileged"),
        (
            {
                "securityContext": {
                    "runAsNonRoot": True,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "c",
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
            "restricted",
        ),
    ],
)
def test_pod_security_levels_of_known_pods(pod: dict[str, Any], level: str) -> None:
    assert pod_security_level(pod) == level


def _client(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "namespace_labels": {"kubernetes.io/metadata.name": namespace},
        "labels": labels,
    }


def test_network_policy_lets_only_the_daemons_clients_reach_its_port() -> None:
    policy = _policy()
    labels = _pod_labels()
    (daemon,) = _pod()["containers"]
    port = next(p["containerPort"] for p in daemon["ports"] if p["name"] == "http")
    isvc = _load(ROOT / "deploy" / "kserve" / "inferenceservice.yaml")
    serving = isvc["spec"]["predictor"]["labels"]

    def reaches(other: dict[str, Any], to: int = port) -> bool:
        return allows(policy, NAMESPACE, labels, "Ingress", other, to)

    assert reaches(_client(NAMESPACE, {"run": "debug"}))
    assert reaches(_client("default", serving)), "the inference pods of deploy/kserve/"
    assert reaches(_client("monitoring", {"app.kubernetes.io/name": "prometheus"}))
    assert not reaches(_client("default", {"app": "web"}))
    assert not reaches(_client("default", {**serving, "aioloader/client": "false"}))
    assert not reaches({"ip": "203.0.113.9"})
    assert not reaches(_client(NAMESPACE, {"run": "debug"}), to=port + 1)


def test_network_policy_lets_the_daemon_reach_object_stores_and_dns_only() -> None:
    policy = _policy()
    labels = _pod_labels()

    def reaches(ip: str, port: int, protocol: str = "TCP") -> bool:
        return allows(policy, NAMESPACE, labels, "Egress", {"ip": ip}, port, protocol)

    assert reaches("52.216.8.1", 443)  # an S3 endpoint
    assert reaches("2600:1fa0:80b4::1", 443)
    assert reaches("10.0.0.10", 80)  # an HTTP server in the cluster's network
    assert reaches("10.96.0.10", 53, "UDP") and reaches("10.96.0.10", 53)
    assert not reaches("169.254.169.254", 80), "the instance metadata's credentials"
    assert not reaches("fd00:ec2::254", 80)
    assert not reaches("10.0.0.10", 22)
    assert not reaches("10.0.0.10", 6443)


def _ports() -> dict[str, int]:
    (daemon,) = _pod()["containers"]
    return {p["name"]: p["containerPort"] for p in daemon["ports"]}


JOBS = "kserve-localmodel-jobs"  # KServe's default job namespace (its localModel config)
_JOB = {"batch.kubernetes.io/job-name": "llama-node-1-x7k2q", "job-name": "llama-node-1-x7k2q"}


def test_the_swarm_port_is_reachable_from_daemon_pods_only() -> None:
    policy, labels, ports = _policy(), _pod_labels(), _ports()
    isvc = _load(ROOT / "deploy" / "kserve" / "inferenceservice.yaml")
    serving = isvc["spec"]["predictor"]["labels"]

    def reaches(other: dict[str, Any], port: int) -> bool:
        return allows(policy, NAMESPACE, labels, "Ingress", other, port)

    daemon = _client(NAMESPACE, labels)
    assert reaches(daemon, ports["swarm"]) and reaches(daemon, ports["http"])
    for other in (
        _client(NAMESPACE, {"run": "debug"}),
        _client("default", serving),
        _client("monitoring", {"app.kubernetes.io/name": "prometheus"}),
        _client(JOBS, _JOB),
        _client("default", labels),  # the daemon's labels, in another namespace
        {"ip": "10.0.0.7"},
    ):
        assert not reaches(other, ports["swarm"]), other
        assert not reaches(other, ports["swarm"] + 1), other

    # A daemon may open connections to the others' API and swarm ports, not to any pod's.
    def leaves(other: dict[str, Any], port: int) -> bool:
        return allows(policy, NAMESPACE, labels, "Egress", other, port)

    assert leaves(daemon, ports["swarm"]) and leaves(daemon, ports["http"])
    assert not leaves(_client(NAMESPACE, {"run": "debug"}), ports["swarm"])
    assert not leaves({"ip": "10.0.0.7"}, ports["swarm"])


def test_kserves_download_jobs_reach_the_api_port_only() -> None:
    policy, labels, ports = _policy(), _pod_labels(), _ports()

    def reaches(other: dict[str, Any], port: int) -> bool:
        return allows(policy, NAMESPACE, labels, "Ingress", other, port)

    assert reaches(_client(JOBS, _JOB), ports["http"])
    assert not reaches(_client(JOBS, _JOB), ports["swarm"])
    assert not reaches(_client(JOBS, {"run": "debug"}), ports["http"]), "a Job's pods only"
    assert not reaches(_client("default", _JOB), ports["http"])


def _download_job_pod() -> dict[str, Any]:
    """The pod KServe's node agent makes of the download job's container: the container,
    its args and mounts replaced, the node group's PVC and fsGroup (its launchJob)."""
    csc = _load(ROOT / "deploy" / "kserve" / "localmodel-downloadjob.yaml")
    container = copy.deepcopy(csc["spec"]["container"])
    container["args"] = ["s3://models/llama/", "/mnt/models"]
    container["volumeMounts"] = [
        {"name": "kserve-pvc-source", "mountPath": "/mnt/models", "subPath": "models/llama"}
    ]
    return {
        "containers": [container],
        "restartPolicy": "Never",
        "volumes": [{"name": "kserve-pvc-source", "persistentVolumeClaim": {"claimName": "x"}}],
        "securityContext": {"fsGroup": 1000},
    }


def test_the_download_job_meets_restricted_and_reads_its_token_from_the_secret() -> None:
    pod = _download_job_pod()
    assert pod_security_violations(pod, "restricted") == []
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["AIOLOADER_TOKEN"]["valueFrom"]["secretKeyRef"]
    (daemon,) = _pod()["containers"]
    daemon_env = {e["name"]: e for e in daemon["env"]}
    assert ref == daemon_env["AIOLOADER_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref.get("optional") is not True, "a job without the Secret must wait, not run"
    assert "value" not in env["AIOLOADER_TOKEN"]
    # The docs say to create the Secret in the job namespace too.
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    assert re.search(rf"kubectl -n {JOBS} create secret generic {ref['name']}", docs)

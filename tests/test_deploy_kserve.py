"""deploy/kserve/localmodel-downloadjob.yaml and the swarm's part of deploy/kubernetes/:
KServe's LocalModelCache download job runs `aioloader fetch` through the node's daemon,
and the daemons find each other. Read from the files, against the code they deploy."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from aioloader.fetch.daemon_client import check_daemon_url
from aioloader.settings.table import ROWS
from aioloader.sources.schemes import SCHEMES, remote_names

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"


def _load(path: Path) -> dict[str, Any]:
    (doc,) = list(yaml.safe_load_all(path.read_text()))
    assert isinstance(doc, dict)
    return doc


def _csc() -> dict[str, Any]:
    return _load(KSERVE / "localmodel-downloadjob.yaml")


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env") or ()}


def _daemon() -> dict[str, Any]:
    (daemon,) = _load(K8S / "daemonset.yaml")["spec"]["template"]["spec"]["containers"]
    return daemon  # type: ignore[no-any-return]


def _namespace() -> str:
    return str(_load(K8S / "kustomization.yaml")["namespace"])


def _routes(uri: str) -> bool:
    return any(
        uri.startswith(f["prefix"]) if "prefix" in f else re.fullmatch(f["regex"], uri)
        for f in _csc()["spec"]["supportedUriFormats"]
    )


def test_the_download_job_is_a_local_model_download_job_running_fetch() -> None:
    csc = _csc()
    assert (csc["apiVersion"], csc["kind"]) == ("serving.kserve.io/v1alpha1",
                                                 "ClusterStorageContainer")  # fmt: skip
    assert csc["spec"]["workloadType"] == "localModelDownloadJob"
    container = csc["spec"]["container"]
    # KServe sets the arguments to SRC DEST and its own volume mount: the command is
    # `aioloader fetch` (the image's entrypoint is `aioloader serve`), nothing else.
    assert container["command"] == ["aioloader", "fetch"]
    assert "args" not in container and "volumeMounts" not in container
    known = {row.variable for row in ROWS}
    assert {n for n in _env(container) if n.startswith("AIOLOADER_")} <= known
    # The other ClusterStorageContainer is the InferenceService's init container: both
    # must not claim one workload.
    other = _load(KSERVE / "clusterstoragecontainer.yaml")["spec"]
    assert other.get("workloadType", "initContainer") == "initContainer"


@pytest.mark.parametrize("scheme", sorted(remote_names()))
def test_the_download_job_takes_every_scheme_the_daemon_holds(scheme: str) -> None:
    assert _routes(f"{scheme}://host-or-bucket/models/llama")


@pytest.mark.parametrize(
    "uri", ["/mnt/data/llama", "file:///mnt/data/llama", "pvc://claim/llama", "oci://r/m:1"]
)
def test_the_download_job_takes_no_uri_the_daemon_refuses(uri: str) -> None:
    local = {s.name for s in SCHEMES if not s.remote}
    assert local == {"file"}  # the daemon refuses them: a local path is on the node already
    assert not _routes(uri)


def test_the_download_job_reaches_the_daemon_of_its_own_node() -> None:
    env = _env(_csc()["spec"]["container"])
    url = check_daemon_url(env["AIOLOADER_DAEMON"]["value"], "AIOLOADER_DAEMON")
    host, port = urlsplit(url).hostname, urlsplit(url).port
    service = _load(K8S / "service.yaml")
    assert host == f"{service['metadata']['name']}.{_namespace()}.svc"
    # internalTrafficPolicy Local: a pod's connection goes to an endpoint on its own node.
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    (service_port,) = service["spec"]["ports"]
    assert port == service_port["port"]
    assert float(env["AIOLOADER_DAEMON_WAIT"]["value"]) > 0


def test_the_daemons_find_each_other_through_a_headless_service() -> None:
    peers = _load(K8S / "peers.yaml")
    spec = peers["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True, "a cold cluster's daemons are unready"
    labels = _load(K8S / "daemonset.yaml")["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"].items() <= labels.items()
    daemon = _daemon()
    ports = {p["name"]: p for p in daemon["ports"]}
    assert {p["targetPort"] for p in spec["ports"]} == set(ports)
    assert ports["swarm"]["protocol"] == "TCP" and "hostPort" not in ports["swarm"]
    env = _env(daemon)
    name = f"{peers['metadata']['name']}.{_namespace()}.svc.cluster.local"
    assert env["AIOLOADER_PEERS"]["value"] == f"{name}:{ports['http']['containerPort']}"
    assert int(env["AIOLOADER_SWARM_PORT"]["value"]) == ports["swarm"]["containerPort"]
    listed = _load(K8S / "kustomization.yaml")["resources"]
    assert "peers.yaml" in listed


def test_the_node_group_selects_the_daemons_nodes_away_from_its_cache() -> None:
    group = _load(KSERVE / "localmodelnodegroup.yaml")
    assert (group["apiVersion"], group["kind"]) == ("serving.kserve.io/v1alpha1",
                                                     "LocalModelNodeGroup")  # fmt: skip
    pod = _load(K8S / "daemonset.yaml")["spec"]["template"]["spec"]
    volume = group["spec"]["persistentVolumeSpec"]
    (term,) = volume["nodeAffinity"]["required"]["nodeSelectorTerms"]
    for key, value in pod["nodeSelector"].items():
        assert {"key": key, "operator": "In", "values": [value]} in term["matchExpressions"]
    cache = next(v for v in pod["volumes"] if v["name"] == "cache")["hostPath"]["path"]
    local = volume["local"]["path"]
    assert not local.startswith(cache + "/") and not cache.startswith(local + "/")

"""deploy/: the fields the daemon, vLLM and KServe rely on, read from the files themselves.

scripts/deploy_check.sh validates the Kubernetes manifests against the API's schema
(kubernetes-validate --strict); KServe's custom resources have no schema there, so this
test parses them. Both check that the files agree with the code they deploy.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import aioloader
from aioloader.daemon import app
from aioloader.daemon.config import DAEMON, DEFAULT_GRACE_PERIOD, DEFAULT_PORT
from aioloader.sources.schemes import remote_names
from aioloader.vllm import KEYS

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
K8S = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
SOURCES = Path(aioloader.__file__).parent / "sources"
PYPROJECT = DEPLOY.parent / "pyproject.toml"
# What a URL scheme needs beyond aioloader's own dependencies: pyproject's extra, and the
# source package whose import error names it. https:// takes in Azure's
# https://<account>.blob.core.windows.net URLs, whose account keys need azure.
SCHEME_EXTRAS: dict[str, dict[str, str]] = {
    "http": {},
    "s3": {},
    "https": {"azure": "azure"},
    "az": {"azure": "azure"},
    "gs": {"gcs": "gcs"},
    "hf": {"hf": "hf"},
}
DAEMON_VARIABLES = {row.variable for row in DAEMON}


def _load(path: Path) -> dict[str, Any]:
    (doc,) = list(yaml.safe_load_all(path.read_text()))
    assert isinstance(doc, dict)
    return doc


def _pod(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = _load(K8S / name)["spec"]["template"]["spec"]
    return spec


def _probe_paths(container: dict[str, Any]) -> dict[str, str]:
    return {
        kind: container[kind]["httpGet"]["path"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }


def _restricted(security: dict[str, Any]) -> None:
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]


def _pinned(image: str) -> None:
    name, _, tag = image.rpartition(":")
    assert name and tag and tag != "latest" and "/" not in tag, image


def test_every_manifest_parses_and_the_base_lists_them() -> None:
    for path in DEPLOY.rglob("*.yaml"):
        doc = _load(path)
        assert {"apiVersion", "kind"} <= set(doc), path
    base = _load(K8S / "kustomization.yaml")
    listed = set(base["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    for image in base["images"]:
        assert image["newTag"] != "latest"


def test_daemonset_runs_the_daemon_as_a_non_root_user() -> None:
    pod = _pod("daemonset.yaml")
    assert pod["securityContext"]["runAsNonRoot"] is True
    uid = pod["securityContext"]["runAsUser"]
    assert uid != 0
    (daemon,) = pod["containers"]
    _pinned(daemon["image"])
    _restricted(daemon["securityContext"])
    assert daemon["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in daemon["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(daemon["resources"][kind])

    # The cache: a hostPath the kubelet makes as root, handed to the daemon's uid first.
    env = {e["name"]: e for e in daemon["env"]}
    cache = env["AIOLOADER_CACHE_DIR"]["value"]
    cache_volume = volumes[mounts[cache]]
    assert cache_volume["hostPath"]["type"] == "DirectoryOrCreate"
    (init,) = pod["initContainers"]
    assert init["command"][:2] == ["chown", f"{uid}:{pod['securityContext']['runAsGroup']}"]
    assert init["command"][2] == cache
    assert any(m["name"] == mounts[cache] for m in init["volumeMounts"])
    _restricted(init["securityContext"])
    assert init["securityContext"]["capabilities"]["add"] == ["CHOWN"]


def test_daemonset_speaks_the_daemons_settings_and_routes() -> None:
    pod = _pod("daemonset.yaml")
    (daemon,) = pod["containers"]
    env = {e["name"]: e for e in daemon["env"]}
    assert {name for name in env if name.startswith("AIOLOADER_")} <= DAEMON_VARIABLES
    grace = float(env["AIOLOADER_GRACE_PERIOD"]["value"])
    assert grace < pod["terminationGracePeriodSeconds"]
    assert pod["terminationGracePeriodSeconds"] > DEFAULT_GRACE_PERIOD
    ports = {p["name"]: p for p in daemon["ports"]}
    assert set(ports) == {"http", "swarm"}
    port = ports["http"]
    assert port["containerPort"] == DEFAULT_PORT
    # The probes ask the routes the daemon defines: /health while alive, /ready when cached.
    assert _probe_paths(daemon) == {
        "startupProbe": "/health",
        "livenessProbe": "/health",
        "readinessProbe": "/ready",
    }
    source = Path(app.__file__).read_text()
    for path in ("/health", "/ready"):
        assert f'add_get("{path}"' in source

    # The token comes from a Secret the user creates (tests/test_deploy_security.py).
    assert "secretKeyRef" in env["AIOLOADER_TOKEN"]["valueFrom"]

    service = _load(K8S / "service.yaml")
    labels = _load(K8S / "daemonset.yaml")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]


def _image_extras() -> set[str]:
    """The extras deploy/install.sh installs the wheel with (``"$wheel[a,b]"``, or
    ``"$wheel[$extras]"`` with ``extras=a,b`` set above it)."""
    install = (DEPLOY / "install.sh").read_text()
    (given,) = re.findall(r"pip install .*\"\$wheel\[([^\]]+)\]\"", install)
    if given.startswith("$"):
        (given,) = re.findall(rf"^{re.escape(given[1:])}=(\S+)$", install, re.MULTILINE)
    return set(given.split(","))


def _routed_schemes() -> set[str]:
    """The URL schemes the ClusterStorageContainer sends to the image."""
    formats = _load(KSERVE / "clusterstoragecontainer.yaml")["spec"]["supportedUriFormats"]
    schemes = set()
    for given in formats:
        if "prefix" in given:
            scheme, separator, _ = given["prefix"].partition("://")
            assert separator, given
            schemes.add(scheme)
        else:
            candidates = set(SCHEME_EXTRAS) | {"file", "ftp", "gcs", "oci", "pvc"}
            schemes |= {s for s in candidates if re.fullmatch(given["regex"], f"{s}://h/m")}
    return schemes


def test_the_image_installs_a_client_for_every_scheme_it_is_sent() -> None:
    routed = _routed_schemes()
    served = remote_names() | routed
    assert served <= set(SCHEME_EXTRAS), "a scheme this test does not know: add it above"
    extras = set(tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"])
    needed = {"daemon"}
    for scheme in served:
        for extra, package in SCHEME_EXTRAS[scheme].items():
            assert extra in extras, extra
            text = "".join(p.read_text() for p in (SOURCES / package).glob("*.py"))
            assert f"aioloader[{extra}]" in text, (scheme, package, extra)
            needed.add(extra)
    missing = needed - _image_extras()
    assert not missing, (
        f"deploy/install.sh installs no {sorted(missing)}, yet {sorted(served)} reach the image"
    )


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    for image in re.findall(r"^FROM (\S+)", text, re.MULTILINE):
        _pinned(image)
    (user,) = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", user), "a numeric non-root uid"
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", text, re.MULTILINE)
    assert json.loads(entrypoint) == ["aioloader", "serve"]
    assert "torch" not in text.replace("no torch", "")
    assert "deploy/install.sh" in text  # the step scripts/deploy_check.sh runs outside Docker
    assert {"daemon", "uvloop"} <= _image_extras()


def test_inferenceservice() -> None:
    isvc = _load(KSERVE / "inferenceservice.yaml")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["kind"] == "InferenceService"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    predictor = isvc["spec"]["predictor"]
    assert predictor["securityContext"]["runAsNonRoot"] is True
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    _pinned(container["image"])
    _restricted(container["securityContext"])
    args = dict(a.split("=", 1) for a in container["args"] if a.startswith("--"))
    assert args["--load-format"] == "aioloader"
    extra = json.loads(args["--model-loader-extra-config"])
    assert set(extra) <= set(KEYS), "keys aioloader.vllm accepts"
    for kind in ("requests", "limits"):
        assert container["resources"][kind]["nvidia.com/gpu"] == "1"
    assert set(_probe_paths(container).values()) == {"/health"}

    # The node cache, mounted read-only where cache_dir points.
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == extra["cache_dir"])
    assert mount["readOnly"] is True
    volume = next(v for v in predictor["volumes"] if v["name"] == mount["name"])
    daemon_cache = next(v for v in _pod("daemonset.yaml")["volumes"] if v["name"] == "cache")
    assert volume["hostPath"]["path"] == daemon_cache["hostPath"]["path"]
    assert (
        predictor["securityContext"]["runAsUser"]
        == (_pod("daemonset.yaml")["securityContext"]["runAsUser"])
    )


@pytest.mark.parametrize(
    "uri",
    [
        "hf://org/model",
        "s3://bucket/model/",
        "gs://bucket/model/",
        "az://container/model/",
        "https://host/models/llama",
        "http://host/models/llama",
        "https://account.blob.core.windows.net/container/model",
    ],
)
def test_cluster_storage_container_takes(uri: str) -> None:
    csc = _load(KSERVE / "clusterstoragecontainer.yaml")
    assert csc["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert csc["kind"] == "ClusterStorageContainer"
    formats = csc["spec"]["supportedUriFormats"]
    assert any(
        uri.startswith(f["prefix"]) if "prefix" in f else re.fullmatch(f["regex"], uri)
        for f in formats
    )


def test_cluster_storage_container_runs_aioloader_fetch() -> None:
    container = _load(KSERVE / "clusterstoragecontainer.yaml")["spec"]["container"]
    assert container["name"] == "storage-initializer"  # how KServe finds it
    _pinned(container["image"])
    # KServe appends SRC DEST as the arguments: the command is `aioloader fetch`.
    assert container["command"] == ["aioloader", "fetch"]
    assert "args" not in container
    assert container["securityContext"]["runAsNonRoot"] is True
    _restricted(container["securityContext"])


def test_docs_point_at_deploy_instead_of_copies() -> None:
    docs = Path(__file__).resolve().parent.parent / "docs"
    for name in ("kubernetes.md", "vllm.md"):
        text = (docs / name).read_text()
        assert "deploy/" in text, name
        blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
        assert not any("apiVersion:" in block for block in blocks), f"{name} copies a manifest"


def test_the_daemonsets_settings_start_a_daemon_that_refuses_strangers() -> None:
    """The DaemonSet listens on every address: it starts only because its token comes
    from the Secret; the same pod without it would be refused at startup (issue 42)."""
    import argparse

    from aioloader import ConfigError
    from aioloader.daemon.config import add_arguments, config_from_args

    (daemon,) = _pod("daemonset.yaml")["containers"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(daemon["args"])
    token = "0123456789abcdef0123456789abcdef"  # what the Secret's command makes
    env = {
        e["name"]: e.get("value", token)
        for e in daemon["env"]
        if e["name"].startswith("AIOLOADER_")
    }
    assert (
        "secretKeyRef"
        in next(e for e in daemon["env"] if e["name"] == "AIOLOADER_TOKEN")["valueFrom"]
    )
    config = config_from_args(args, env)
    assert config.host == "0.0.0.0" and config.token == token and not config.no_auth
    env.pop("AIOLOADER_TOKEN")
    with pytest.raises(ConfigError, match="openssl rand -hex 32"):
        config_from_args(args, env)
    # The image's default command listens on every address too: it needs the token.
    (cmd,) = re.findall(r"^CMD (.+)$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    with pytest.raises(ConfigError, match="--no-auth"):
        config_from_args(parser.parse_args(json.loads(cmd)), {})

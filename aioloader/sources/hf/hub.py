"""The Hub's API through ``huggingface_hub``: settings, resolving a revision, errors.

huggingface_hub owns the Hub's protocol, its token discovery (``HF_TOKEN``, the
token file ``huggingface-cli login`` writes) and its environment; this module is
the one place that calls it, and the one place its exceptions become ours. Its
calls block, so the source runs them in its own threads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import AccessDeniedError, ConfigError, NotFoundError, SourceError
from .snapshot import Snapshot
from .url import HfLocation, is_commit

if TYPE_CHECKING:
    from .hf_cache import HfCache

__all__ = ["HubSettings", "download_file", "resolve_snapshot"]

_TRUE = frozenset({"1", "ON", "YES", "TRUE"})
_LOGIN = "log in with `huggingface-cli login` (or set HF_TOKEN)"


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise ConfigError(
            "hf:// URLs need huggingface_hub; install aioloader[hf] (pip install 'aioloader[hf]')"
        ) from None
    return huggingface_hub


@dataclass(frozen=True)
class HubSettings:
    """Where the Hub is and who asks.

    Attributes:
        endpoint: the Hub's base URL (``HF_ENDPOINT``, else huggingface_hub's default).
        token: the token huggingface_hub finds (``HF_TOKEN``, the login's token file),
            or None.
        offline: ``HF_HUB_OFFLINE`` is set: the hub cache answers, the Hub is never asked.
        cache: the hub cache (``HF_HUB_CACHE``, ``HF_HOME/hub`` or huggingface_hub's).
    """

    endpoint: str
    token: str | None
    offline: bool
    cache: Path

    def __repr__(self) -> str:
        return f"HubSettings(endpoint={self.endpoint!r}, token={'set' if self.token else None})"

    @classmethod
    def from_env(cls) -> HubSettings:
        """Read the settings now (the environment may have changed since
        huggingface_hub was imported, which is when it reads its own constants)."""
        from .hf_cache import cache_root

        hub = _hub()
        from huggingface_hub import constants

        endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        variable = os.environ.get("HF_HUB_OFFLINE")
        offline = variable.upper() in _TRUE if variable else constants.HF_HUB_OFFLINE
        return cls(endpoint.rstrip("/"), hub.get_token(), offline, cache_root())


def resolve_snapshot(settings: HubSettings, location: HfLocation) -> Snapshot:
    """The commit ``location.revision`` points to now, and the repository's files at it.

    Blocking: run it in a thread.

    Raises:
        AccessDeniedError: a gated or private repository, or a refused token.
        NotFoundError: no such repository or revision.
        SourceError: the Hub could not be reached or answered something else.
    """
    hub = _hub()
    api = hub.HfApi(endpoint=settings.endpoint, token=settings.token or False)
    repo, revision = location.repo_id, location.revision
    try:
        sha = api.model_info(repo, revision=revision).sha
        if not isinstance(sha, str) or not is_commit(sha):
            raise SourceError(
                f"{location.url()}: {settings.endpoint} gave no commit sha for {repo}@{revision}; "
                "check that HF_ENDPOINT points at a Hugging Face Hub"
            )
        entries = [
            entry
            for entry in api.list_repo_tree(repo, revision=sha, recursive=True)
            if isinstance(entry, hub.hf_api.RepoFile)
        ]
    except Exception as exc:
        error = _translate(exc, settings, location)
        if error is None:
            raise
        raise error from exc
    files = {entry.path: entry.size for entry in entries}
    ids = {entry.path: entry.lfs.sha256 if entry.lfs else entry.blob_id for entry in entries}
    return Snapshot(repo, revision, sha, files, ids)


def download_file(settings: HubSettings, cache: HfCache, snapshot: Snapshot, path: str) -> None:
    """Download one file of ``snapshot`` into the hub cache, by huggingface_hub itself.

    Blocking: run it in a thread.

    Raises:
        SourceError: as ``resolve_snapshot``.
    """
    hub = _hub()
    location = HfLocation(snapshot.repo_id, snapshot.sha, path)
    try:
        hub.hf_hub_download(
            snapshot.repo_id,
            path,
            revision=snapshot.sha,
            cache_dir=cache.root,
            endpoint=settings.endpoint,
            token=settings.token or False,
        )
    except Exception as exc:
        error = _translate(exc, settings, location)
        if error is None:
            raise
        raise error from exc


def _translate(exc: Exception, settings: HubSettings, loc: HfLocation) -> SourceError | None:
    """huggingface_hub's exception as ours, or None for one that is not the Hub's."""
    import httpx2
    from huggingface_hub import errors

    where = f"{loc.url()}: {loc.repo_id}@{loc.revision} at {settings.endpoint}"
    page = f"{settings.endpoint}/{loc.repo_id}"
    if isinstance(exc, errors.GatedRepoError):
        if settings.token is None:
            return AccessDeniedError(
                f"{where} is a gated repository and no Hugging Face token was found: accept "
                f"its licence on {page} while logged in, then {_LOGIN}"
            )
        return AccessDeniedError(
            f"{where} is a gated repository that this token may not read yet: accept its "
            f"licence on {page} with the token's account, or use a token of an account that has"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return NotFoundError(
            f"{where}: the repository has no revision {loc.revision!r}; check the branch, tag "
            "or commit sha"
        )
    if isinstance(exc, errors.HfHubHTTPError):
        response = exc.response
        status = getattr(response, "status_code", None)
        message = response.headers.get("X-Error-Message", "") if response is not None else ""
        if status == 401 and message == "Invalid credentials in Authorization header":
            return AccessDeniedError(
                f"{where}: the Hub refused the token (invalid or expired); {_LOGIN} with a "
                "valid token"
            )
        if isinstance(exc, errors.RepositoryNotFoundError) or status == 401:
            if settings.token is None and status == 401:
                return AccessDeniedError(
                    f"{where}: no such repository can be read without a token; check the "
                    f"name, and if it is private or gated, {_LOGIN}"
                )
            return NotFoundError(
                f"{where}: the repository does not exist, or this token may not read it; "
                "check the name and the token's access"
            )
        if status == 403:
            return AccessDeniedError(
                f"{where}: the Hub refused access (HTTP 403 {message}); check the token's "
                "permissions"
            )
        return SourceError(f"{where}: the Hub answered HTTP {status}; try again later")
    if isinstance(exc, httpx2.HTTPError | OSError):
        return SourceError(
            f"{where}: the Hub could not be reached ({type(exc).__name__}: {exc}); check the "
            "network and HF_ENDPOINT"
        )
    return None

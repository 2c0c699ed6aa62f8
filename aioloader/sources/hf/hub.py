"""The Hub's API through ``huggingface_hub``: settings, resolving a revision, errors.

huggingface_hub owns the Hub's protocol, its token discovery (``HF_TOKEN``, the
token file ``huggingface-cli login`` writes) and its environment; this module is
the one place that calls it, and the one place its exceptions become ours. Its
calls block, so the source runs them in its own threads.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import AccessDeniedError, ConfigError, NotFoundError, SourceError
from .snapshot import Snapshot
from .tree import TreeEntry, entry_from_json, escapes
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
            once ``with_token`` looked for it; else None.
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
        """Read the settings now, without the token (the environment may have changed
        since huggingface_hub was imported, which is when it reads its own constants)."""
        from .hf_cache import cache_root

        _hub()
        from huggingface_hub import constants

        endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        variable = os.environ.get("HF_HUB_OFFLINE")
        offline = variable.upper() in _TRUE if variable else constants.HF_HUB_OFFLINE
        return cls(endpoint.rstrip("/"), None, offline, cache_root())

    def with_token(self) -> HubSettings:
        """These settings with the token huggingface_hub finds. Looked for only before
        the Hub is asked: its lookup reads files and imports its HTTP client, which a
        load from the hub cache does without. Blocking: run it in a thread."""
        return dataclasses.replace(self, token=_hub().get_token())


def resolve_snapshot(
    settings: HubSettings, location: HfLocation, cache: HfCache, sha: str | None = None
) -> Snapshot:
    """The commit ``location.revision`` points to now (``sha`` when the caller knows
    it already), and the repository's files at it.

    A commit's listing kept in the hub cache (``trees/<commit>.json``, tree.py) is
    used instead of asking the Hub for it: a branch or tag costs one request (the
    commit it points to). The caller looks for a commit sha's listing itself, to
    ask nothing at all, without even the token.

    Blocking: run it in a thread.

    Raises:
        AccessDeniedError: a gated or private repository, or a refused token.
        NotFoundError: no such repository or revision.
        SourceError: the Hub could not be reached, answered something else, or
            listed a file whose name or id cannot be a file of the cache.
    """
    repo, revision = location.repo_id, location.revision
    hub = _hub()
    api = hub.HfApi(endpoint=settings.endpoint, token=settings.token or False)
    try:
        if sha is None:
            sha = revision if is_commit(revision) else api.model_info(repo, revision=revision).sha
        if not isinstance(sha, str) or not is_commit(sha):
            raise SourceError(
                f"{location.url()}: {settings.endpoint} gave no commit sha for {repo}@{revision}; "
                "check that HF_ENDPOINT points at a Hugging Face Hub"
            )
        tree = cache.read_tree(sha)
        if tree is not None:
            return Snapshot.of_tree(repo, revision, sha, tree)
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
    return Snapshot.of_tree(repo, revision, sha, _checked_tree(entries, settings, location, sha))


def _checked_tree(
    entries: list[Any], settings: HubSettings, location: HfLocation, sha: str
) -> dict[str, TreeEntry]:
    tree = {}
    for entry in entries:
        path = entry.path
        checked = entry_from_json(
            {
                "size": entry.size,
                "blob_id": entry.blob_id,
                "lfs_sha256": entry.lfs.sha256 if entry.lfs else None,
                "xet_hash": getattr(entry, "xet_hash", None),
            }
        )
        # A name aioloader does not make a file of stays listed (snapshot.py leaves it
        # out of the files); one reaching outside the snapshot discredits the listing.
        why = escapes(path) or (None if checked else "its size or blob id is malformed")
        if checked is None or why is not None:
            raise SourceError(
                f"{location.url()}: {settings.endpoint} listed a file {path!r} in "
                f"{location.repo_id} at {sha[:12]}, which cannot be a file of a snapshot: {why}; "
                "check that HF_ENDPOINT points at a Hugging Face Hub, and report it to the "
                "Hub's operators"
            )
        tree[path] = checked
    return tree


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

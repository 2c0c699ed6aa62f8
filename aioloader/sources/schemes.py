"""The URL schemes aioloader reads, one row each: the one table that the source
picker (auto.py), the node cache's fetch, the daemon and the docs take them from.

A row names the backend that reads the scheme (its module and class, imported when
a URL of the scheme is first used), whether it is remote (the node cache and the
daemon hold remote files only; local files are already on the node), the extra
that installs what it needs, and how the docs write it. ``https://`` URLs of an
Azure storage account (``<account>.blob.core.windows.net``) are read by Azure's
backend (auto.py); the table lists the scheme itself once, with HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SCHEMES", "Scheme", "listed", "markdown_table", "remote_names", "scheme_named"]


@dataclass(frozen=True)
class Scheme:
    """One URL scheme and the backend that reads it.

    Attributes:
        name: the scheme as a URL writes it, lower-case (``"s3"``; ``"file"`` for paths).
        module: the backend's module under ``aioloader.sources`` (``"s3.source"``).
        cls: the backend's Source class in that module.
        takes: the settings its constructor takes after the lanes, in order: ``"http"``
            (HttpOptions), ``"s3"`` (S3Options), ``"hf_check"`` (a RevisionCheck).
        remote: whether the files are on another machine.
        extra: the ``pip install "aioloader[extra]"`` it needs; None when none.
        display: how messages and docs write it (``"s3://"``).
        store: what it reads, for the docs' table.
    """

    name: str
    module: str
    cls: str
    takes: tuple[str, ...]
    remote: bool
    extra: str | None
    display: str
    store: str


# name, module, class, takes, remote, extra, display, what it reads
SCHEMES: tuple[Scheme, ...] = (
    Scheme("file", "file", "FileSource", (), False, None, "file://", "local paths and files"),
    Scheme("http", "http.source", "HttpSource", ("http",), True, None, "http://", "HTTP servers"),
    Scheme("https", "http.source", "HttpSource", ("http",), True, None, "https://",
           "HTTPS servers"),
    Scheme("s3", "s3.source", "S3Source", ("http", "s3"), True, None, "s3://",
           "S3 and S3-compatible stores"),
    Scheme("gs", "gcs.source", "GcsSource", ("http",), True, "gcs", "gs://",
           "Google Cloud Storage"),
    Scheme("az", "azure.source", "AzureSource", ("http",), True, "azure", "az://",
           "Azure Blob Storage (also its https:// accounts)"),
    Scheme("hf", "hf.source", "HfSource", ("http", "hf_check"), True, "hf", "hf://",
           "the Hugging Face Hub"),
)  # fmt: skip

_BY_NAME = {s.name: s for s in SCHEMES}


def scheme_named(name: str) -> Scheme | None:
    """The row of scheme ``name`` (lower-case, as ``auto.scheme_of`` gives it); None when
    aioloader reads no such scheme."""
    return _BY_NAME.get(name)


def remote_names() -> frozenset[str]:
    """The remote schemes: what the node cache and the daemon hold."""
    return frozenset(s.name for s in SCHEMES if s.remote)


def listed(*, remote: bool = False) -> str:
    """The schemes as messages write them: ``"http://, https://, ... and hf://"``
    (only the remote ones with ``remote``)."""
    shown = [s.display for s in SCHEMES if s.remote or not remote]
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def markdown_table() -> str:
    """The table docs/remote-storage.md shows (tests/test_schemes.py keeps them equal)."""
    rows = ["| Scheme | Reads | Remote | Install |", "|---|---|---|---|"]
    for s in SCHEMES:
        install = f'`pip install "aioloader[{s.extra}]"`' if s.extra else "included"
        rows.append(f"| `{s.display}` | {s.store} | {'yes' if s.remote else 'no'} | {install} |")
    return "\n".join(rows)

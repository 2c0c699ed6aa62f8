"""The ``aioloader`` command line: load, inspect, fetch, serve, cache verify, swarm view."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TextIO

from . import __version__, log_lines
from .api import Loader, ModelInfo
from .errors import LoaderError
from .format.dtypes import import_torch
from .load.stack import locate
from .redact import redact
from .runtime.sync import run
from .settings.options import KEYWORDS
from .settings.resolver import resolve
from .settings.texts import for_flag
from .settings.values import MiB, format_size

__all__ = ["main"]

_CACHE_DIR = next(k for k in KEYWORDS if k.name == "cache_dir")

# A tensor holding more than this share of its file leaves the parallel readers little to
# share (it is read by chunks, but its neighbours cannot overlap with it): worth a word.
_DOMINANT_SHARE = 0.5


def _progress_bar(out: TextIO) -> Any:
    """tqdm's bar on a terminal (``disable=None``), in bytes and bytes/s since the start
    (``smoothing=0``: the average speed, not a moving one); silent elsewhere."""
    from tqdm import tqdm

    return tqdm(file=out, disable=None, unit="B", unit_scale=True, smoothing=0, mininterval=0.1)


def _show(bar: Any, done: int, total: int) -> None:
    if total > 0:
        bar.total = total
        bar.update(done - bar.n)


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not 'Name: value'")
    return name.strip(), value.strip()


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    """A flag for every keyword of a load that has a text form (options.py's table)."""
    group = parser.add_argument_group("load options (each also read from AIOLOADER_<NAME>)")
    for keyword in KEYWORDS:
        if keyword.parse is None:
            continue
        variable = f" [{keyword.variable}]" if keyword.env else ""
        group.add_argument(
            keyword.flag,
            type=for_flag(keyword.parse),
            dest=f"option_{keyword.name}",
            help=f"{keyword.help}{variable}",
            metavar=keyword.name.upper(),
        )
    group.add_argument(
        "--header",
        type=_header,
        action="append",
        dest="option_headers",
        help="an HTTP header sent with every request to the model's host (repeatable)",
        metavar="'NAME: VALUE'",
    )


def _load_options(args: argparse.Namespace) -> dict[str, Any]:
    options = {
        name[len("option_") :]: value
        for name, value in vars(args).items()
        if name.startswith("option_") and value is not None
    }
    if "headers" in options:
        options["headers"] = dict(options["headers"])
    return options


async def _load(args: argparse.Namespace) -> int:
    with _progress_bar(sys.stderr) as bar:
        async with Loader(**_load_options(args)) as loader:
            tensors = args.tensor or None
            async with loader.stream(locate(args.url), tensors=tensors) as stream:
                last = 0.0
                async for _ in stream:
                    now = time.perf_counter()
                    if now - last > 0.1:
                        stats = stream.statistics()
                        _show(bar, stats.bytes_done, stats.bytes_total)
                        last = now
                stats = stream.statistics()
                _show(bar, stats.bytes_done, stats.bytes_total)
            report = stream.report
    assert report is not None
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
    return 0


def describe(info: ModelInfo) -> dict[str, Any]:
    """What ``aioloader inspect`` shows, as data."""
    tensors = [t for h in info.headers for t in h.tensors]
    total = sum(t.nbytes for t in tensors)
    largest = max(tensors, key=lambda t: t.nbytes, default=None)
    files = []
    warnings = []
    for header in info.headers:
        size = header.data_bytes
        big = max(header.tensors, key=lambda t: t.nbytes, default=None)
        files.append(
            {
                "url": header.url,
                "tensors": len(header.tensors),
                "data_mib": round(size / MiB, 2),
                "largest_tensor": big.name if big else None,
                "largest_tensor_mib": round(big.nbytes / MiB, 2) if big else 0,
            }
        )
        if big is not None and size > 64 * MiB and big.nbytes > _DOMINANT_SHARE * size:
            warnings.append(
                f"{header.url}: tensor {big.name!r} holds {big.nbytes / size:.0%} of the file "
                f"({format_size(big.nbytes)}); aioloader splits it into parallel chunks, but "
                "loaders that read tensor by tensor will be slow on this file"
            )
    return {
        "url": info.url,
        "index": info.layout.index,
        "files": files,
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "bytes": t.nbytes,
                "file": header.url,
            }
            for header in info.headers
            for t in header.tensors
        ],
        "tensor_count": len(tensors),
        "dtypes": dict(sorted(Counter(t.dtype for t in tensors).items())),
        "total_mib": round(total / MiB, 2),
        "largest_tensor": largest.name if largest else None,
        "largest_tensor_mib": round(largest.nbytes / MiB, 2) if largest else 0,
        "metadata": info.metadata,
        "warnings": warnings,
    }


def _print_tensors(tensors: list[dict[str, Any]]) -> None:
    """One line per tensor: name, dtype, shape and size, in columns."""
    if not tensors:
        return
    rows = [(t["name"], t["dtype"], "[" + ", ".join(map(str, t["shape"])) + "]") for t in tensors]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    print()
    for (name, dtype, shape), tensor in zip(rows, tensors, strict=True):
        print(
            f"{name:<{widths[0]}}  {dtype:<{widths[1]}}  {shape:<{widths[2]}}  "
            f"{format_size(tensor['bytes'])}"
        )


async def _inspect(args: argparse.Namespace) -> int:
    async with Loader() as loader:
        info = await loader.inspect(locate(args.url))
    data = describe(info)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{data['url']}: {data['tensor_count']} tensors in {len(data['files'])} file(s)")
    if data["index"]:
        print(f"  index: {data['index']}")
    print(f"  total: {data['total_mib']:.2f} MiB")
    print(f"  largest tensor: {data['largest_tensor']} ({data['largest_tensor_mib']:.2f} MiB)")
    print("  dtypes: " + ", ".join(f"{k} x{v}" for k, v in data["dtypes"].items()))
    for f in data["files"]:
        print(
            f"  {f['url']}: {f['tensors']} tensors, {f['data_mib']:.2f} MiB, "
            f"largest {f['largest_tensor']} ({f['largest_tensor_mib']:.2f} MiB)"
        )
    if data["metadata"]:
        print("  metadata: " + json.dumps(data["metadata"]))
    _print_tensors(data["tensors"])
    for warning in data["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


async def _fetch(args: argparse.Namespace) -> int:
    from .fetch.copy import copy_folder
    from .fetch.daemon_client import printer
    from .fetch.daemon_flags import from_args

    through = from_args(args)
    if through:
        through["progress"] = printer(sys.stderr)
    done = await copy_folder(args.src, args.dest, **_load_options(args), **through)
    print(done.summary(), file=sys.stderr)
    for name in done.files:
        print(name)
    return 0


def _cache_folder(args: argparse.Namespace) -> str | None:
    """The cache folder ``cache verify`` checks; None after saying why there is none."""
    root = resolve(_CACHE_DIR, args.cache_dir)
    if not root:
        problem = "give the cache folder with --cache-dir or AIOLOADER_CACHE_DIR"
    elif not os.path.isdir(root):
        problem = (
            f"the cache folder {root} does not exist (or is not a folder); "
            "check --cache-dir / AIOLOADER_CACHE_DIR"
        )
    else:
        return str(root)
    print(f"aioloader: error: {problem}", file=sys.stderr)
    return None


async def _cache_verify(args: argparse.Namespace) -> int:
    from .cache import ModelCache

    results = await ModelCache(args.cache_dir).verify(args.url or None)
    for result in results:
        if result.status == "ok":
            print(f"ok {result.url}")
        else:
            removed = " (removed: the next load downloads it again)" if result.removed else ""
            print(f"{result.status} {result.url}: {result.detail}{removed}")
    bad = sum(r.status in ("corrupt", "missing") for r in results)
    print(f"{len(results)} file(s) checked, {bad} bad", file=sys.stderr)
    return 1 if bad else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aioloader", description="Stream safetensors weights into memory."
    )
    # -v before or after the subcommand: SUPPRESS keeps the main parser's value unless given.
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at DEBUG"
    )
    parser.add_argument("--version", action="version", version=f"aioloader {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    load = sub.add_parser("load", parents=[common], help="load a model and report how long it took")
    load.add_argument("url", help="file, folder of shards, or *.safetensors.index.json")
    _add_load_options(load)
    load.add_argument(
        "--tensor", action="append", help="load only this tensor (repeatable)", metavar="NAME"
    )
    load.add_argument("--json", action="store_true", help="print the report as JSON")

    inspect = sub.add_parser(
        "inspect", parents=[common], help="show tensors, dtypes and sizes from the headers"
    )
    inspect.add_argument("url")
    inspect.add_argument("--json", action="store_true", help="print as JSON")

    fetch = sub.add_parser(
        "fetch",
        parents=[common],
        help="copy a model folder (weights, config and tokenizer files) into a local folder",
        description="Called as a storage initializer is (`aioloader fetch SRC DEST`): files, "
        "sub-folders included, land under their names only when all are complete; prints the "
        "names copied. DEST keeps the files fetch did not write; those an earlier fetch wrote "
        "(recorded in DEST/.aioloader-fetch.json) and the new version lacks are removed, so "
        "DEST then holds exactly the new version. With --daemon, the node's daemon downloads "
        "the model and fetch copies what it holds from it.",
    )
    fetch.add_argument("src", help="folder, index or .safetensors URL: hf://, s3://, gs://, ...")
    fetch.add_argument(
        "dest", help="the local folder (made if missing); fetch removes only what it wrote there"
    )
    _add_load_options(fetch)
    from .fetch.daemon_flags import add_arguments as add_daemon_arguments

    add_daemon_arguments(fetch)

    cache = sub.add_parser("cache", parents=[common], help="look after a node-local model cache")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    verify = cache_sub.add_parser(
        "verify",
        parents=[common],
        help="hash cached files again; remove and report those whose bytes changed",
        description="Exits 1 when a file is corrupt (it is removed) or a URL is not cached.",
    )
    verify.add_argument(
        _CACHE_DIR.flag, help=f"the cache folder [{_CACHE_DIR.variable}]", metavar="DIR"
    )
    verify.add_argument("url", nargs="*", help="cached file URLs to check (default: all)")

    from .daemon.config import add_arguments

    serve = sub.add_parser(
        "serve",
        parents=[common],
        help="run the preload daemon: keep models in a node-local cache, with an HTTP API",
        description="Each option also reads the environment variable shown in brackets.",
    )
    add_arguments(serve)
    from .fetch.swarm_view import add_parser as add_swarm_view

    add_swarm_view(sub, common)
    return parser


async def _swarm(args: argparse.Namespace) -> int:
    from .fetch.swarm_view import main as view

    return await view(args)


async def _serve(args: argparse.Namespace) -> int:
    from .daemon.server import serve_from_args

    return await serve_from_args(args)


def _run(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """``main()`` on a fresh loop (sync.py), uvloop's when it is installed."""
    try:
        import uvloop
    except ImportError:
        factory = None
    else:
        factory = uvloop.new_event_loop
    return run(
        main, caller="aioloader", instead="run the command from a shell", loop_factory=factory
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aioloader`` command."""
    args = _parser().parse_args(argv)
    serving = args.command == "serve"
    quiet = logging.INFO if serving else logging.WARNING
    log_lines.configure(logging.DEBUG if args.verbose else quiet, stamped=serving)
    logging.getLogger("aioloader").debug("command %s, Python %s", args.command, sys.version)
    handler = {
        "load": _load,
        "inspect": _inspect,
        "fetch": _fetch,
        "serve": _serve,
        "cache": _cache_verify,
        "swarm": _swarm,
    }[args.command]
    if args.command == "cache":
        args.cache_dir = _cache_folder(args)
        if args.cache_dir is None:
            return 2
    try:
        if args.command == "load" and (args.option_framework or "torch") == "torch":
            # A load would import torch in a worker thread; first, the report is about the
            # load (it takes seconds). In the try: Ctrl-C then is no traceback.
            import_torch()
        return _run(lambda: handler(args))
    except LoaderError as exc:
        # Any URL in it without its signature: a presigned URL's query is a secret.
        print(f"aioloader: error: {redact(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aioloader: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _pipe_closed()


def _pipe_closed() -> int:
    """The reader of stdout went away (``aioloader inspect ... | head``): end quietly, as
    Python's docs advise (stdout to /dev/null, so that the flush at exit does not fail
    again), with the status of a process SIGPIPE killed (141); SIGPIPE stays ignored: a
    load's sockets must not kill the process."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13


if __name__ == "__main__":
    sys.exit(main())

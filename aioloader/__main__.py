"""``python -m aioloader`` and the ``aioloader`` command: ``cli.main``, then an exit
that skips the interpreter's teardown (``entry``)."""

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

from .cli import main

__all__ = ["entry"]


def entry() -> NoReturn:
    """Run the command and exit with its status, as the interpreter would but for the
    teardown of every module that it then runs: with torch loaded that takes seconds,
    and tens of them on a busy machine, after the command's work is done (a Ctrl-C
    seemed not to end the process). What a normal exit runs first still runs: the
    threads that finish work after a load are joined (cache writes and commits, through
    threading's own exit hook, the one the interpreter calls), then the atexit
    callbacks (logging's flush among them); then the streams are flushed."""
    code = main()
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()

"""Whether the buffer a read fills keeps its bytes until the load returns: a hint from
a load to the sources that read into it.

A source that checks a file's digest (sources/verifying.py) hashes each range in
file order, so a range that lands early waits. Its bytes can wait where they are
when nothing changes them before the load returns, or must be copied first:

- host memory is filled in place: the buffer is the tensor's own memory, handed
  out when the load returns, so it keeps its bytes (``Device.stage`` says so while
  the read runs, for a device that does not copy);
- a staging slot (a GPU's ring) is reused once its copy is done;
- a stream hands each tensor out as it lands, to a caller who may change it in
  place (``HANDED_OUT``, set for the stream's load task);
- anything else (``aioloader fetch``, the node cache's fetch) reads into buffers
  of its own, reused at once: the default.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["BUFFERS_KEPT", "HANDED_OUT"]

#: True while a read fills memory that keeps its bytes until the load returns.
BUFFERS_KEPT: ContextVar[bool] = ContextVar("aioloader_buffers_kept", default=False)
#: True in a load that hands each tensor out as it lands (a stream).
HANDED_OUT: ContextVar[bool] = ContextVar("aioloader_handed_out", default=False)

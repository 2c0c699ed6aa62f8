"""Caches filled by the loads that read through them: one way for every cache.

A load that reads a remote file can leave its bytes in a cache on the way: the node
cache (cache/) and the Hugging Face hub cache (its writer is hf/ here; sources/hf/ reads
it). Each is a ``Sink`` (base.py): it takes a file's bytes as they arrive, then commits
the file, or drops it, once the load is done with it. ``FillingBlob`` (filling_blob.py) is the blob
that feeds a sink while it reads, in one of two ways:

* write through: each range is written before its read returns, for staged (GPU)
  loads, whose buffers are reused as soon as a read returns;
* write after: a read returns at once and the sink keeps the caller's memory (host
  tensors, which stay as they are) to write once the load is over.

The commits run after the load has returned, in the process's commit threads,
keyed by the cache's folder (commits.py).
"""

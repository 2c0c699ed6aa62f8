"""How aioloader runs, below every feature: named thread lanes (``threads.py``),
coroutines together (``tasks.py``), ordered slots (``turns.py``), the sync bridge
(``sync.py``), ``async with`` for closers (``resource.py``), pacing and throttling of
requests (``pace.py``, ``throttle.py``), fresh memory faulted in off the loop
(``prefault.py``), ``O_DIRECT`` and ``preadv`` (``direct_io.py``), small files through
aiofiles (``small_files.py``), the container's memory limit (``container_memory.py``)
and the log filter (``message_filter.py``)."""

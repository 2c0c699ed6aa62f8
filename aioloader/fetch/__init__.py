"""``aioloader fetch SRC DEST``: copy a model folder to local disk (``copy.py``), the
files it copies (``files.py``), the folder it writes to (``dest.py``), and the node's
daemon it may copy from instead (``daemon_client.py``, ``daemon_flags.py``)."""

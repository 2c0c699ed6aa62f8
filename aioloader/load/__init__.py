"""The load itself: open a model (``open_model.py``), read it through its stack of
sources and caches (``stack.py``) into its destinations (``pipeline.py``), hand its
tensors out (``stream.py``) and say what it did (``report.py``)."""

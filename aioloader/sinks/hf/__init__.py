"""The Hugging Face cache's writer: a ``hf://`` load fills the Hub's own cache layout
(``cache_writes.py``), blob by blob (``blob_writer.py`` for host loads,
``blob_through.py`` for staged ones, ``sink.py`` its sink). Reading that cache is
``sources/hf/``'s."""

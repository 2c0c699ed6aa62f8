"""Settings, in one room: ``table.py`` is the table (one row per setting and the
parsers of their text forms), ``resolver.py`` the resolver (the one place ``AIOLOADER_*``
is read, and the order keyword > variable > default), ``values.py`` the values (small
frozen dataclasses: ``Limits``, ``HttpOptions``, ``S3Options``), and ``options.py`` one
load's options (``LoadOptions``, built once from the keywords)."""

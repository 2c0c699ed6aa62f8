"""HTTP(S) storage and the HTTP machinery every remote store shares.

``source.py`` reads plain http(s) URLs; S3, GCS and Azure (the sibling folders)
hold an ``HttpStore`` (store.py) with their own Signer. The rest, one concept a
module: ``client.py`` (our HTTP/1.1 range client), ``lanes.py`` (its receive
threads), ``transport.py``, ``retry.py``,
``rules.py`` (HTTP semantics as pure functions), ``blob.py``, ``filler.py``,
``signer.py``, ``listing.py``.

Nothing is imported here, so that importing one module of this folder does not
import aiohttp.
"""

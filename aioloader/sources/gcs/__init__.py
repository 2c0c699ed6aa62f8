"""Google Cloud Storage: ``gs://bucket/object``.

``source.py`` is the Source, ``url.py`` parses gs:// URLs and builds the JSON API's,
``signer.py`` finds the credentials, ``blob.py`` is an object pinned to its
generation. Nothing is imported here: google-auth and aiohttp load when a gs://
URL is first read.
"""

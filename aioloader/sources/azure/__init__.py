"""Azure Blob Storage: ``az://container/path`` and ``https://<account>.blob.core.windows.net/...``.

``source.py`` is the Source; ``settings.py`` reads what the environment says
(the connection string, parsed there only); ``url.py`` finds a URL's account,
container and blob; ``signer.py`` picks and renews the credentials. Nothing is
imported here: azure-identity, azure-storage-blob and aiohttp load when an Azure
URL is first read.
"""

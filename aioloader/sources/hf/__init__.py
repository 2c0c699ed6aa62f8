"""The Hugging Face Hub: ``hf://org/name@revision/path``.

``url.py`` parses hf:// URLs (pure), ``snapshot.py`` is a repository's files at one
commit (pure), ``hub.py`` asks the Hub through ``huggingface_hub`` (which owns the
API, the token, the endpoint and its environment), ``signer.py`` sends the token
to the Hub's host only, and ``source.py`` is the Source. Nothing is imported here:
huggingface_hub and aiohttp load when an hf:// URL is first read.
"""

"""Real local servers for tests, one module per protocol, under the names tests import.

``FaultyHttpServer`` (tests/http_server.py) serves files over HTTP and misbehaves on
request; ``MotoS3Server`` (tests/s3_server.py) is moto's S3 behind a real endpoint;
``GcsEmulator`` (tests/gcs_server.py) is gcp-storage-emulator's Cloud Storage.
"""

from __future__ import annotations

from .gcs_server import GcsEmulator
from .http_server import FaultyHttpServer, RequestRecord
from .s3_server import MotoS3Server

__all__ = ["FaultyHttpServer", "GcsEmulator", "MotoS3Server", "RequestRecord"]

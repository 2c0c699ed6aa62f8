"""moto's S3 behind a real local endpoint for tests: ``MotoS3Server``.

Like ``FaultyHttpServer`` (tests/http_server.py) it listens on 127.0.0.1 on a port the
OS picks and serves from a background thread, so a subprocess started by the test can
reach it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from .lifetime import StartStop

if TYPE_CHECKING:
    import pytest

__all__ = ["MotoS3Server"]


class MotoS3Server(StartStop):
    """moto's S3 implementation behind a real HTTP endpoint on 127.0.0.1.

    Use as ``with MotoS3Server() as server:``; ``server.endpoint`` is the base URL and
    ``server.client()`` a botocore S3 client for preparing buckets and objects.

    What moto 5.2 does about authentication, as found by experiment (tests/test_servers.py
    checks each point):

    * By default moto does not check signatures at all: any access key, any secret and any
      SigV4 signature are accepted for signed requests.
    * Unsigned requests (no ``Authorization`` header) are treated as anonymous: GET of an
      object whose ACL is private answers 403, GET of an object uploaded with
      ``ACL="public-read"`` or in a bucket whose policy allows ``s3:GetObject`` to
      ``Principal: "*"`` answers 200 (Range works too). Anonymous ListObjects is allowed.
    * With ``enforce_auth=True`` moto verifies SigV4: an unknown access key gets 403
      ``InvalidAccessKeyId``, a known key with a wrong secret 403 ``SignatureDoesNotMatch``.
      Only keys of IAM users exist, and ``"testing"`` is not one, so the server then
      creates an IAM user with an ``s3:*`` policy and its key becomes ``credentials``
      (used by ``client()`` and ``set_env()``). In that mode moto fails every unsigned or
      presigned-URL request with a 500 (it reads a missing Authorization header), so
      anonymous access and presigned URLs can only be tested without enforcement.
    * Enforcement is switched through moto's own ``POST /moto-api/reset-auth`` endpoint,
      which sets ``moto.settings.INITIAL_NO_AUTH_ACTION_COUNT``; the env var of that name
      is read once at import, so setting it later would do nothing. Both the setting and
      moto's backends are global to the process: every moto server (and ``mock_aws``) in
      this process shares buckets and the enforcement switch. ``stop()`` switches it off.
    """

    REGION = "us-east-1"

    def __init__(self, *, enforce_auth: bool = False) -> None:
        self.enforce_auth = enforce_auth
        self.credentials: tuple[str, str] = ("testing", "testing")
        self._server: Any = None

    def start(self) -> Self:
        from moto.server import ThreadedMotoServer

        # Port 0 lets the OS choose; ThreadedMotoServer reports the bound port afterwards.
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        if self.enforce_auth:
            self._create_iam_user()
            self._set_auth_count("0")
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if self.enforce_auth:
            self._set_auth_count_on(server, "inf")
        server.stop()
        # ThreadedMotoServer.stop() shuts the loop down but leaves the listening socket
        # open; close it, or its finalizer warns (an error under filterwarnings=error).
        inner = getattr(server, "_server", None)
        if inner is not None:
            inner.server_close()

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.get_host_and_port()[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _set_auth_count(self, value: str) -> None:
        self._set_auth_count_on(self._server, value)

    @staticmethod
    def _set_auth_count_on(server: Any, value: str) -> None:
        host, port = server.get_host_and_port()
        request = urllib.request.Request(
            f"http://{host}:{port}/moto-api/reset-auth",
            data=value.encode(),
            method="POST",
            # Without a non-form content type the body would be parsed as a form and lost.
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def _create_iam_user(self) -> None:
        """An IAM user allowed s3:*, whose key the tests then sign with."""
        iam = self.client(service="iam")
        try:
            name = f"aioloader-tests-{os.getpid()}-{id(self):x}"
            iam.create_user(UserName=name)
            iam.put_user_policy(
                UserName=name,
                PolicyName="s3-all",
                PolicyDocument=json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
                    }
                ),
            )
            key = iam.create_access_key(UserName=name)["AccessKey"]
        finally:
            iam.close()
        self.credentials = (key["AccessKeyId"], key["SecretAccessKey"])

    def client(
        self,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        service: str = "s3",
    ) -> Any:
        """A botocore client for this server (path-style addressing, us-east-1).

        Close it (``client.close()``) when done: its connection pool holds sockets.
        """
        import botocore.session
        from botocore.config import Config

        session = botocore.session.Session()
        return session.create_client(
            service,
            region_name=self.REGION,
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key or self.credentials[0],
            aws_secret_access_key=secret_key or self.credentials[1],
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (moto wants names of 3 to 63 characters)."""
        with contextlib.closing(self.client()) as s3:
            s3.create_bucket(Bucket=bucket)

    def put_object(self, bucket: str, key: str, body: bytes, **extra: Any) -> None:
        """Upload ``body`` as ``key``; ``extra`` goes to PutObject (e.g. ``ACL=...``)."""
        with contextlib.closing(self.client()) as s3:
            s3.put_object(Bucket=bucket, Key=key, Body=body, **extra)

    def upload(self, bucket: str, prefix: str, local_path: Path, **extra: Any) -> list[str]:
        """Upload a file, or a folder recursively, under ``prefix``; returns the keys.

        A file lands at ``prefix/name``, a folder's files at ``prefix/relative/path``.
        The bucket is created when missing.
        """
        local_path = Path(local_path)
        prefix = prefix.strip("/")
        if local_path.is_dir():
            files = sorted(p for p in local_path.rglob("*") if p.is_file())
            pairs = [(p, p.relative_to(local_path).as_posix()) for p in files]
        else:
            pairs = [(local_path, local_path.name)]
        keys = []
        with contextlib.closing(self.client()) as s3:
            with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
                s3.create_bucket(Bucket=bucket)
            for file, rel in pairs:
                key = f"{prefix}/{rel}" if prefix else rel
                with file.open("rb") as fh:
                    s3.put_object(Bucket=bucket, Key=key, Body=fh, **extra)
                keys.append(key)
        return keys

    def set_env(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path | None = None) -> None:
        """Point AWS SDK-style configuration at this server, and nowhere else.

        Profiles and shared config/credential files are pointed at files that do not
        exist (under ``tmp_path`` when given), so a developer's ~/.aws cannot leak in.
        """
        access_key, secret_key = self.credentials
        monkeypatch.setenv("AWS_ENDPOINT_URL", self.endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", self.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret_key)
        monkeypatch.setenv("AWS_REGION", self.REGION)
        monkeypatch.setenv("AWS_DEFAULT_REGION", self.REGION)
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        for var in (
            "AWS_PROFILE",
            "AWS_DEFAULT_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_SECURITY_TOKEN",
        ):
            monkeypatch.delenv(var, raising=False)
        nowhere = (tmp_path or Path("/nonexistent")) / "no-aws"
        monkeypatch.setenv("AWS_CONFIG_FILE", str(nowhere / "config"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere / "credentials"))

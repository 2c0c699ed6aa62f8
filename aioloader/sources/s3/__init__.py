"""S3 and S3-compatible object storage (MinIO, Ceph RGW, ...).

``source.py`` is the Source; ``url.py`` turns ``s3://bucket/key`` into the store's
URLs; ``signer.py`` holds the configuration, credentials and AWS Signature V4 it
signs every request with. Nothing is imported here: botocore and aiohttp load when
an s3:// URL is first read.
"""

"""A real S3-compatible server (moto's ThreadedMotoServer) on 127.0.0.1, for the object-store tests.

Clients find it through the standard AWS environment variables (``AWS_ENDPOINT_URL`` and test
credentials), so ``deltackpt.save(obj, "s3://bucket/run1")`` works unchanged, in this process and in
subprocesses that inherit the environment.
"""

from __future__ import annotations

import os
import secrets

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class S3Server:
    def __init__(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.env = {**S3_ENV, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint}
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)

    def bucket(self) -> str:
        """A fresh empty bucket's name."""
        import boto3

        name = f"dk-{secrets.token_hex(6)}"
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(Bucket=name)
        return name

    def clear_fs_cache(self) -> None:
        import s3fs
        s3fs.S3FileSystem.clear_instance_cache()

    def reset(self) -> None:
        """Drop every bucket and close the temp files holding their objects (moto's reset call)."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"),
                               timeout=30).close()

    def stop(self) -> None:
        self.server.stop()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

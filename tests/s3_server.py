"""A local S3-compatible server for the object-store tests: moto's server mode (a real HTTP server
speaking S3, as s3fs's own test suite uses), on an address of this machine, with a bucket in it.
No network and no AWS account: fake credentials, an endpoint URL."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

BUCKET = "slurmkit-test"


@dataclass(frozen=True)
class S3:
    endpoint: str
    env: dict[str, str]
    """What a process needs to reach it: AWS_ENDPOINT_URL, fake credentials, a region."""

    def fs(self) -> Any:
        """An s3fs filesystem on it, with explicit arguments (s3fs caches instances by them), its
        listing cache dropped: what is on the server now."""
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=self.endpoint, key="testing", secret="testing")
        fs.invalidate_cache()
        return fs


@contextmanager
def serving(ip: str) -> Iterator[S3]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address=ip, port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3 = S3(f"http://{host}:{port}", {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                                          "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
        fs = s3.fs()
        if not fs.exists(BUCKET):  # moto keeps its buckets per process: an earlier server of this run made it
            fs.mkdir(BUCKET)
        yield s3
    finally:
        server.stop()

"""Helpers to test pipelines built on astream, with real components on 127.0.0.1.

- :class:`LoopbackServer`: a static-file HTTP server on 127.0.0.1 (in a private thread,
  so sync and async code can use it) with Range/ETag support and fault injection:
  errors (500, 429 with ``Retry-After``), a connection reset mid-body, a slow first
  byte, a stall, a truncated or corrupted body, and a request log.
- :class:`MemoryStorage`: an in-memory remote under ``memory://<bucket>/<key>``.
- :func:`moto_s3`: moto's standalone S3 server on 127.0.0.1 with the ``S3_ENDPOINT_URL``
  and ``AWS_*`` variables pointed at it (needs ``moto[server]``).

Nothing here ever listens on or connects to an address other than 127.0.0.1. The server
lives in :mod:`astream._loopback`, re-exported here.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

from astream._loopback import HOST, Fault, LoopbackServer, Request
from astream._storage.memory import MemoryStorage, memory_bucket, memory_factory
from astream._storage.registry import register
from astream.errors import UsageError

__all__ = ["Fault", "LoopbackServer", "MemoryStorage", "Request", "free_port", "memory_bucket", "moto_s3"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (right now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


register("memory", memory_factory)


# -- moto S3 ----------------------------------------------------------------------------------
@contextlib.contextmanager
def moto_s3(bucket: str | None = "astream-test") -> Iterator[Any]:
    """Run moto's S3 server on 127.0.0.1 and point ``S3_ENDPOINT_URL``/``AWS_*`` at it.

    Yields a botocore S3 client (sync) for setting up objects; the bucket ``bucket`` is
    created unless it is None. Environment variables are restored afterwards.
    """
    try:
        import botocore.session
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # pragma: no cover
        raise UsageError("moto_s3 needs `pip install 'moto[server]'`") from exc
    port = free_port()
    server = ThreadedMotoServer(ip_address=HOST, port=port, verbose=False)
    server.start()
    env = {
        "S3_ENDPOINT_URL": f"http://{HOST}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in (*env, "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION")}
    os.environ.update(env)
    for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION"):
        os.environ.pop(k, None)
    try:
        client = botocore.session.get_session().create_client(
            "s3", endpoint_url=env["S3_ENDPOINT_URL"], region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )
        if bucket:
            client.create_bucket(Bucket=bucket)
        yield client
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()

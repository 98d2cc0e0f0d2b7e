"""The loopback server of the cold runs: :class:`astream.testing.LoopbackServer` in a process
of its own (not a thread of the driver, whose interpreter lock the runs would share), with
an optional throttle: one link of ``bandwidth`` bytes per second that every response shares.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import TracebackType

__all__ = ["Server"]

_SERVE = """
import json, sys
from astream.testing import LoopbackServer
bandwidth = float(sys.argv[2]) or None
with LoopbackServer(sys.argv[1], bandwidth=bandwidth) as server:
    print(server.port, flush=True)
    for line in sys.stdin:  # "log": the requests seen so far, as one JSON line
        print(json.dumps([[r.method, r.path, r.range] for r in server.log]), flush=True)
"""


class Server:
    """Serves ``root`` (the data folder: datasets under ``bucket/``) on 127.0.0.1 until closed."""

    def __init__(self, root: Path, bandwidth: float | None = None, env: dict[str, str] | None = None) -> None:
        self.root = root.resolve()
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(self.root), str(bandwidth or 0)], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"the loopback server of {root} did not start")
        self.port = int(line)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, folder: Path) -> str:
        """The HTTP URL of a dataset folder under the root."""
        return f"{self.endpoint}/{folder.resolve().relative_to(self.root).as_posix()}"

    def s3(self, folder: Path) -> str:
        """The same folder as a path-style S3 URL (the first folder is the bucket)."""
        return f"s3://{folder.resolve().relative_to(self.root).as_posix()}"

    def s3_env(self) -> dict[str, str]:
        """What an S3 client needs to reach this server (botocore sends it plain GET/HEAD/Range)."""
        return {"S3_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
                "AWS_DEFAULT_REGION": "us-east-1"}

    def requests(self) -> list[tuple[str, str, str | None]]:
        """Every request the server saw so far: (method, path, Range header)."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write("log\n")
        self._proc.stdin.flush()
        return [(m, p, r) for m, p, r in json.loads(self._proc.stdout.readline())]

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

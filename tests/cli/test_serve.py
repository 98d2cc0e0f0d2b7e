"""``astream serve``: fetch from it with aiohttp on 127.0.0.1, then stop it with SIGINT."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
from clikit import Run, assert_one_line_error


async def _fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers or {}) as resp:
        return resp.status, await resp.read()


def test_serve_answers_on_loopback_and_stops_on_sigint(dataset: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "astream.cli", "serve", str(dataset), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:(\d+)) ", first)
        assert match, first
        url = match.group(1)
        index = (dataset / "index.json").read_bytes()
        assert asyncio.run(_fetch(f"{url}/index.json")) == (200, index)
        assert asyncio.run(_fetch(f"{url}/index.json", {"Range": "bytes=5-9"})) == (206, index[5:10])
        assert asyncio.run(_fetch(f"{url}/nothing.mds"))[0] == 404
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopped" in out
    assert "Traceback" not in err
    assert '"GET /index.json HTTP/1.1" 200' in err  # the access log, on stderr


def test_serve_bad_arguments(cli: Run, main: Run, tmp_path: Path) -> None:
    assert_one_line_error(cli("serve", str(tmp_path / "absent")), 1, "absent", "no such directory")
    assert_one_line_error(main("serve", str(tmp_path), "--port", "70000"), 2, "--port")
    assert_one_line_error(main("serve"), 2, "DIR")


def test_serve_a_busy_port(main: Run, tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(main("serve", str(tmp_path), "--port", str(port), "-q"), 1, f"127.0.0.1:{port}")

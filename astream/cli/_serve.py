"""``astream serve``: a static HTTP server for a directory, on 127.0.0.1 only.

For trying a remote locally: ``astream serve ./ds`` then
``StreamingDataset(remote="http://127.0.0.1:8000", ...)``. aiohttp's static handler
answers GET and HEAD with Range support (which astream's downloader uses to resume)
and never follows symlinks out of the directory. Ctrl-C (SIGINT) or SIGTERM stops it
cleanly. It binds 127.0.0.1 and nothing else: it is not meant to be reachable from
other machines.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from aiohttp import web

from astream._storage.loop import run as run_loop
from astream.cli._output import CommandError

__all__ = ["HOST", "add_parser", "run", "serve"]

HOST = "127.0.0.1"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream serve``."""
    p = sub.add_parser("serve", parents=[common], help="serve a directory over HTTP on 127.0.0.1",
                       description="Serve DIR over HTTP on 127.0.0.1 (only) until Ctrl-C.")
    p.add_argument("directory", metavar="DIR", help="the directory to serve (e.g. an MDS dataset)")
    p.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one (default: 8000)")
    p.set_defaults(func=run)


async def serve(root: str, port: int, quiet: bool) -> None:
    """Serve ``root`` on ``http://127.0.0.1:port`` until SIGINT or SIGTERM."""
    app = web.Application()
    app.router.add_static("/", root, show_index=True)
    log = None
    if not quiet:
        log = logging.getLogger("astream.serve")
        log.propagate = False
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    runner = web.AppRunner(app, handle_signals=False, access_log=log,
                           access_log_format='%a "%r" %s %b', shutdown_timeout=0.5)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, HOST, port)
        try:
            await site.start()
        except OSError as exc:
            raise CommandError(f"cannot listen on {HOST}:{port}: {exc.strerror or exc}") from exc
        server: Any = site._server
        bound = int(server.sockets[0].getsockname()[1])
        # The URL line is flushed at once: scripts (and the tests) read the port from it.
        print(f"serving {root} at http://{HOST}:{bound} (Ctrl-C to stop)", flush=True)
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    print("stopped", flush=True)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; exit code 0 after a clean stop."""
    root = os.path.realpath(args.directory)
    if not os.path.isdir(root):
        raise CommandError(f"{args.directory}: no such directory")
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be 0..65535, got {args.port}", 2)
    run_loop(serve(root, args.port, bool(getattr(args, "quiet", False))))
    return 0

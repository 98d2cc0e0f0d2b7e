"""The loopback HTTP server of :mod:`astream.testing`: static files with fault injection.

Apart from :mod:`astream.testing` (which re-exports it) because serving files with
Range/ETag support, fault injection and a shared bandwidth is one job of its own; the
public module keeps the small helpers beside it (ports, moto's S3, the memory remote).
Only ever listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web

from astream._storage.loop import LoopThread

__all__ = ["HOST", "Fault", "LoopbackServer", "Request"]

HOST = "127.0.0.1"


@dataclass
class Fault:
    """One injected misbehaviour for requests whose path matches ``match`` (fnmatch).

    Attributes:
        kind: ``"status"`` (answer ``status``), ``"reset"`` (close the connection after
            ``after`` body bytes), ``"delay"`` (wait ``seconds`` before the headers),
            ``"stall"`` (stop for ``seconds`` after ``after`` bytes), ``"truncate"``
            (close cleanly after ``after`` bytes, short of Content-Length), ``"corrupt"``
            (flip the first byte of the body).
        match: pattern of the path relative to the server root (``"*.zstd"``).
        times: how many requests it hits; None for all of them.
        status: the status of a ``"status"`` fault.
        retry_after: the ``Retry-After`` header to send with it, if any.
        after: body bytes sent before a reset, stall or truncation.
        seconds: length of a delay or stall.
        ranged: hit only requests with a ``Range`` header (True), only those without
            (False), or both (None).
        gate: a stall, reset or truncation waits after ``after`` bytes until this event is
            set (a stall then goes on at once): the test decides when a body moves on.
    """

    kind: str
    match: str = "*"
    times: int | None = 1
    status: int = 500
    retry_after: str | None = None
    after: int = 0
    seconds: float = 0.0
    ranged: bool | None = None
    gate: threading.Event | None = None


@dataclass(frozen=True)
class Request:
    """One request the server saw."""

    method: str
    path: str
    range: str | None


@dataclass
class _State:
    faults: list[Fault] = field(default_factory=list)
    log: list[Request] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class LoopbackServer:
    """A static file server for ``root`` on ``http://127.0.0.1:<port>``, with fault injection.

    Use it as a (sync) context manager; it runs on its own loop in a daemon thread::

        with LoopbackServer(dataset_dir) as server:
            server.add(Fault("status", match="shard.00001*", status=503, times=2))
            ...  # remote = server.url
            assert server.count("shard.00001.mds.zstd") == 3

    Args:
        root: the directory served.
        ranges: honour ``Range`` requests (off: always send the whole file, 200).
        allow_put: accept ``PUT`` uploads into ``root``.
        chunk_size: body bytes written at a time by the fault-injecting path.
        ssl_context: serve HTTPS with this server context (e.g. from ``trustme``).
        require_headers: answer 401 to a request that lacks one of these headers (or has
            another value), as a server behind a bearer token does.
        bandwidth: bytes per second all bodies share (one link: concurrent responses
            take turns chunk by chunk), or None for as fast as the loopback goes.
    """

    def __init__(
        self,
        root: str,
        *,
        ranges: bool = True,
        allow_put: bool = False,
        chunk_size: int = 64 << 10,
        ssl_context: ssl.SSLContext | None = None,
        require_headers: Mapping[str, str] | None = None,
        bandwidth: float | None = None,
    ) -> None:
        self.root = os.path.realpath(root)
        self.ssl_context = ssl_context
        self.require_headers = dict(require_headers or {})
        self.ranges = ranges
        self.allow_put = allow_put
        self.chunk_size = chunk_size
        if bandwidth is not None and not bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bytes per second, got {bandwidth!r}")
        self.bandwidth = bandwidth
        self._link_free = 0.0  # when the shared link has sent everything it was given
        self._state = _State()
        self._thread: LoopThread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The base URL (no trailing slash)."""
        return f"{'https' if self.ssl_context else 'http'}://{HOST}:{self.port}"

    # -- faults and the log --------------------------------------------------------------------
    def add(self, fault: Fault) -> Fault:
        """Inject ``fault``; returns it (its ``times`` counts down as it hits)."""
        with self._state.lock:
            self._state.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove all faults and forget the request log."""
        with self._state.lock:
            self._state.faults.clear()
            self._state.log.clear()
            self._state.max_active = 0

    @property
    def log(self) -> list[Request]:
        with self._state.lock:
            return list(self._state.log)

    @property
    def max_active(self) -> int:
        """The most requests the server was answering at the same time."""
        with self._state.lock:
            return self._state.max_active

    def count(self, match: str = "*", method: str | None = "GET") -> int:
        """Requests so far whose path matches ``match`` (and ``method``, unless None)."""
        return sum(
            1 for r in self.log if fnmatch.fnmatch(r.path, match) and (method is None or r.method == method)
        )

    def _take_fault(self, path: str, ranged: bool) -> Fault | None:
        with self._state.lock:
            for fault in self._state.faults:
                if fault.ranged is not None and fault.ranged != ranged:
                    continue
                if (fault.times is None or fault.times > 0) and fnmatch.fnmatch(path, fault.match):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    # -- serving -------------------------------------------------------------------------------
    def _resolve(self, rel: str) -> str:
        path = os.path.realpath(os.path.join(self.root, rel))
        if not (path == self.root or path.startswith(self.root + os.sep)):
            raise web.HTTPForbidden()
        return path

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rel = request.match_info["tail"]
        with self._state.lock:
            self._state.log.append(Request(request.method, rel, request.headers.get("Range")))
            self._state.active += 1
            self._state.max_active = max(self._state.max_active, self._state.active)
        try:
            return await self._answer(request, rel)
        finally:
            with self._state.lock:
                self._state.active -= 1

    async def _answer(self, request: web.Request, rel: str) -> web.StreamResponse:
        path = self._resolve(rel)
        if any(request.headers.get(k) != v for k, v in self.require_headers.items()):
            return web.Response(status=401, text="credentials required\n")
        fault = self._take_fault(rel, "Range" in request.headers)
        if fault is not None and fault.kind == "delay":
            await asyncio.sleep(fault.seconds)
            fault = None
        if fault is not None and fault.kind == "status":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            return web.Response(status=fault.status, text=f"injected {fault.status}\n", headers=headers)
        if request.method == "PUT":
            return await self._put(request, path)
        if not os.path.isfile(path):  # noqa: ASYNC240 - test server, a stat
            raise web.HTTPNotFound()
        if fault is None and self.ranges and self.bandwidth is None:
            return web.FileResponse(path, chunk_size=256 << 10)
        return await self._stream(request, path, fault)

    async def _stream(self, request: web.Request, path: str, fault: Fault | None) -> web.StreamResponse:
        st = os.stat(path)
        etag = f'"{st.st_mtime_ns:x}-{st.st_size:x}"'
        start, stop, status = 0, st.st_size, 200
        rng = request.headers.get("Range")
        if_range = request.headers.get("If-Range")
        if rng and self.ranges and (if_range is None or if_range == etag) and rng.startswith("bytes="):
            # One range, "first-" or "first-last"; like FileResponse, a last past the end is
            # clamped to it (RFC 9110 14.1.2), and anything else is ignored (whole file, 200).
            first, _, last = rng[6:].partition("-")
            if first.isdigit() and (last == "" or (last.isdigit() and int(last) >= int(first))):
                start, status = int(first), 206
                if last:
                    stop = min(int(last) + 1, st.st_size)
                if start >= st.st_size:
                    return web.Response(status=416, headers={"Content-Range": f"bytes */{st.st_size}"})
        length = stop - start
        resp = web.StreamResponse(status=status)
        resp.headers["ETag"] = etag
        resp.headers["Accept-Ranges"] = "bytes" if self.ranges else "none"
        resp.content_length = length
        if status == 206:
            resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{st.st_size}"
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        sent = 0
        with open(path, "rb") as fh:  # noqa: ASYNC230 - test server, small local reads
            fh.seek(start)
            while sent < length:
                data = fh.read(min(self.chunk_size, length - sent))
                if not data:
                    break
                cut = fault is not None and fault.kind in ("reset", "stall", "truncate")
                if fault is not None and cut and sent + len(data) > fault.after:
                    data = data[: max(0, fault.after - sent)]
                    if data:
                        await resp.write(data)
                    if fault.gate is not None:
                        # (a threading.Event: the test sets it from its own thread)
                        await asyncio.get_running_loop().run_in_executor(None, fault.gate.wait)
                    if fault.kind in ("reset", "truncate"):
                        assert request.transport is not None
                        # reset: RST right away; truncate: a clean FIN before Content-Length is reached
                        (request.transport.abort if fault.kind == "reset" else request.transport.close)()
                        return resp
                    if fault.gate is None:
                        await asyncio.sleep(fault.seconds)
                    # A stall goes on where it stopped (the rest of this chunk is read again).
                    sent += len(data)
                    fh.seek(start + sent)
                    fault = None
                    continue
                if fault is not None and fault.kind == "corrupt":
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                    fault = None
                await self._pace(len(data))
                await resp.write(data)
                sent += len(data)
        return resp

    async def _pace(self, size: int) -> None:
        """Hold ``size`` bytes back until the shared link has room for them."""
        if self.bandwidth is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._link_free = max(self._link_free, now) + size / self.bandwidth
        await asyncio.sleep(self._link_free - now)

    async def _put(self, request: web.Request, path: str) -> web.Response:
        if not self.allow_put:
            raise web.HTTPMethodNotAllowed("PUT", ["GET", "HEAD"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.put"
        with open(tmp, "wb") as fh:  # noqa: ASYNC230 - test server
            async for chunk in request.content.iter_chunked(1 << 20):
                fh.write(chunk)
        os.replace(tmp, path)
        return web.Response(status=201)

    # -- lifecycle -----------------------------------------------------------------------------
    async def _start(self) -> None:
        app = web.Application(client_max_size=1 << 34)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0, ssl_context=self.ssl_context)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def _stop(self) -> None:
        if self._runner is not None:
            server = self._runner.server
            await self._runner.cleanup()
            if server is not None:
                # Connections a client still keeps alive (a node agent lingers with its pool):
                # a TLS one's orderly close waits for the peer, and the loop closes right
                # after this, so drop them now (uvloop refuses to close over open handles).
                for handler in list(server.connections):
                    if handler.transport is not None:
                        handler.transport.abort()
                await asyncio.sleep(0)  # (their connection_lost, on this loop)
            self._runner = None

    def start(self) -> LoopbackServer:
        """Start serving (idempotent)."""
        if self._thread is None:
            self._thread = LoopThread("astream-loopback-server")
            self._thread.call(self._start())
        return self

    def close(self) -> None:
        """Stop serving; idempotent."""
        thread, self._thread = self._thread, None
        if thread is not None:
            with contextlib.suppress(Exception):
                thread.call(self._stop(), timeout=10)
            thread.close()

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

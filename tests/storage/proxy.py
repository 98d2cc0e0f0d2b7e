"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an emulator (GCS, Azurite, moto, a file server).

Every request is forwarded to ``upstream`` unchanged (method, path, query, headers, body)
unless a :class:`astream.testing.Fault` matches its path (fnmatch over the unquoted path
and query): ``status`` answers that status (with ``Retry-After``) without asking upstream;
``reset`` and ``truncate`` forward the request, then cut the answer's body after
``fault.after`` bytes (a RST, or a clean close before Content-Length is reached).
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import threading
from types import TracebackType
from urllib.parse import unquote

import aiohttp
from aiohttp import web

from astream._storage.loop import LoopThread
from astream.testing import HOST, Fault

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer", "upgrade"}


class FaultProxy:
    """Forward ``http://127.0.0.1:<port>/...`` to ``upstream``, misbehaving on request."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults: list[Fault] = []
        self.log: list[tuple[str, str]] = []
        self.authorizations: list[str | None] = []  # the Authorization header of each request
        self._lock = threading.Lock()
        self._thread: LoopThread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.log.clear()
            self.authorizations.clear()

    def count(self, match: str, method: str | None = None) -> int:
        with self._lock:
            return sum(1 for m, p in self.log if fnmatch.fnmatch(p, match) and (method is None or m == method))

    def _take(self, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if (fault.times is None or fault.times > 0) and fnmatch.fnmatch(path, fault.match):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = unquote(request.path_qs)
        with self._lock:
            self.log.append((request.method, path))
            self.authorizations.append(request.headers.get("Authorization"))
        fault = self._take(path)
        if fault is not None and fault.kind == "status":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            return web.Response(status=fault.status, text=f"injected {fault.status}\n", headers=headers)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers["Host"] = request.headers.get("Host", self.upstream.split("://", 1)[1])
        body = await request.read()
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=io.BytesIO(body) if body else None,
            allow_redirects=False, auto_decompress=False,
        ) as up:
            if request.method == "HEAD":
                await up.read()
                head = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in _HOP or k.lower() == "content-length":
                        head.headers.add(k, v)
                await head.prepare(request)
                return head
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in _HOP or k.lower() == "content-length":
                    resp.headers.add(k, v)
            await resp.prepare(request)
            sent = 0
            async for data, _ in up.content.iter_chunks():
                if fault is not None and fault.kind in ("reset", "truncate") and sent + len(data) > fault.after:
                    keep = data[: max(0, fault.after - sent)]
                    if keep:
                        await resp.write(keep)
                    assert request.transport is not None
                    (request.transport.abort if fault.kind == "reset" else request.transport.close)()
                    return resp
                await resp.write(data)
                sent += len(data)
            await resp.write_eof()
            return resp

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1 << 34)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> FaultProxy:
        self._thread = LoopThread("astream-fault-proxy")
        self._thread.call(self._start())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            with contextlib.suppress(Exception):
                thread.call(self._stop(), timeout=10)
            thread.close()

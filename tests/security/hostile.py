"""Helpers of the hostile-input tests: small tars, and a child process run under a memory
cap (``RLIMIT_AS``), as the audit of issue 32 ran its cases."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hostile"


def small_tar(members: dict[str, bytes]) -> bytes:
    """A plain tar holding ``members`` (name -> body)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def run_capped(setup: str, cases: dict[str, str], cap_mb: int = 64, timeout: float = 240) -> dict[str, str]:
    """Run each case in a child Python whose address space is capped at its size before the case + ``cap_mb``.

    ``setup`` runs first, uncapped (imports, objects). Then, for each case in turn, the
    child measures its virtual size (the baseline), lowers ``RLIMIT_AS`` to it plus
    ``cap_mb``, runs the case's code, and lifts the cap again.

    Returns:
        Per case, its outcome: ``"AstreamError-class: message"`` for an ``AstreamError``,
        ``"MemoryError"`` (the cap was hit), ``"ok"`` (nothing raised) or ``"other: repr"``.
    """
    lines = ["import resource, sys", "from astream.errors import AstreamError", textwrap.dedent(setup),
             "def _vm():",
             "    with open('/proc/self/status') as fh:",
             "        return next(int(l.split()[1]) << 10 for l in fh if l.startswith('VmSize:'))"]
    for name, code in cases.items():
        lines += [
            f"resource.setrlimit(resource.RLIMIT_AS, (_vm() + ({cap_mb} << 20), resource.RLIM_INFINITY))",
            "try:",
            textwrap.indent(textwrap.dedent(code), "    "),
            "except AstreamError as exc:",
            "    _out = type(exc).__name__ + ': ' + str(exc)",
            "except MemoryError:",
            "    _out = 'MemoryError'",
            "except BaseException as exc:",
            "    _out = 'other: ' + repr(exc)",
            "else:",
            "    _out = 'ok'",
            "resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))",
            f"print('CASE', {name!r}, _out.replace(chr(10), ' '), flush=True)",
        ]
    # One malloc arena and one BLAS thread: what the child holds is what the case costs;
    # -P: astream comes from REPO, never from the current folder.
    env = {**os.environ, "PYTHONPATH": str(REPO), "MALLOC_ARENA_MAX": "1", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-P", "-c", "\n".join(lines)], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("CASE "):
            _, name, rest = line.split(" ", 2)
            out[name] = rest
    assert set(out) == set(cases), f"the child stopped (rc {done.returncode}): {done.stderr[-3000:]}"
    return out


BOMB = 768 << 20  # what a bomb expands to (the audit's size)
_MIB = bytes(1 << 20)


def bomb(family: str, size: int = BOMB) -> bytes:
    """Stored bytes of codec ``family`` that decode to ``size`` (a multiple of 1 MiB) zero bytes.

    Each is one stream, as a hostile writer would make it, and made in about a second: gz by
    repeating one fully flushed deflate block (the trailer's CRC computed for the whole), bz2
    read from ``tests/fixtures/hostile`` (bzip2 takes ~15 s to compress 768 MiB; smaller ones
    are compressed here), zstd and br compressed as a stream of zero MiBs, and snappy's raw
    block (one block is at most ~21:1) written as its wire format: the length, one literal,
    then copies of 64 bytes.
    """
    import bz2
    import struct
    import zlib

    import zstandard

    mibs = size >> 20
    if family == "gz":
        deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
        head = deflate.compress(_MIB) + deflate.flush(zlib.Z_FULL_FLUSH)
        block = deflate.compress(_MIB) + deflate.flush(zlib.Z_FULL_FLUSH)  # the same bytes each time
        crc = 0
        for _ in range(mibs):
            crc = zlib.crc32(_MIB, crc)
        return head + block * (mibs - 1) + deflate.flush()[:-8] + struct.pack("<II", crc, size & 0xFFFFFFFF)
    if family == "bz2":
        if size == BOMB:
            return (FIXTURES / "zeros-768mib.bz2").read_bytes()
        return bz2.compress(bytes(size))
    if family == "zstd":
        writer = zstandard.ZstdCompressor(level=1).compressobj()
        return b"".join(writer.compress(_MIB) for _ in range(mibs)) + writer.flush()
    if family == "br":
        import brotli

        enc = brotli.Compressor(quality=1)
        return b"".join(enc.process(_MIB) for _ in range(mibs)) + enc.finish()
    if family == "snappy":
        length = bytearray()
        n = size
        while n >= 0x80:
            length.append(n & 0x7F | 0x80)
            n >>= 7
        length.append(n)
        copies, rest = divmod(size - 1, 64)  # a copy-2 op: 64 bytes from offset 1
        tail = bytes([((rest - 1) << 2) | 2, 1, 0]) if rest else b""
        return bytes(length) + b"\x00\x00" + b"\xfe\x01\x00" * copies + tail
    raise ValueError(family)


def tar_bomb(member: int = BOMB) -> bytes:
    """A gzip tar (members: header, the data, the end) of one ``member``-byte sample ``k/000.bin`` of zeros."""
    import gzip

    header = tarfile.TarInfo("k/000.bin")
    header.size = member
    end = bytes(-member % 512 + 1024)
    return gzip.compress(header.tobuf(tarfile.USTAR_FORMAT)) + bomb("gz", member) + gzip.compress(end)

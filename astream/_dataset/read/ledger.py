"""``ServedLedger``: what was served of each shard before its install, and the one check of it.

Every record a reader hands out that did not come from the installed file has a
provenance, noted here when it is served:

- *spans*: byte ranges of the shard (its offset table, runs of records) read from a file
  being written into the cache (named by its device and inode) or from the remote
  (``None``), each with the xxh3-64 of the bytes read (or :data:`FROM_SOURCE`: not hashed
  when served, the still-open file they came from is read again instead);
- *decodings*: a whole shard (a Parquet row group) decoded from bytes whose xxh3-64 is
  known, before it was installed.

When the shard's lease resolves, :meth:`ServedLedger.take` hands over what is owed and
:func:`check` compares it with the installed file, the one every check of the cache
accepted (and every later epoch reads). Spans read from the very file that was renamed
into place are the installed bytes by construction (the engine only appends to a
temporary; a transfer that starts again writes a new file) and are not read back. A
difference raises :class:`~astream.errors.ServedSamplesError`. The reader settles every
owed shard before an iteration ends, so no epoch completes with an unchecked sample.

Sans-I/O: :func:`check` reads through the :class:`Bytes` it is given (the installed file
and the files served from, in :mod:`astream._dataset.read.installed`; in-memory bytes in
the tests), and :func:`same_bytes` is the one comparison of a decoding's digest with a
file's bytes, also where an installed file adopts a decoding (``OpenShards``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import xxhash

from astream.errors import ServedSamplesError

__all__ = ["FROM_SOURCE", "Bytes", "Ident", "Owed", "ServedLedger", "Span", "check", "same_bytes"]

# A file's identity: (st_dev, st_ino).
Ident = tuple[int, int]
# A byte range of a shard and the xxh3-64 of the bytes served from it: (first, stop, digest).
Span = tuple[int, int, int]
# The digest of a span not hashed when served: the file it was read from is compared.
FROM_SOURCE = -1


class Bytes(Protocol):
    """A file's bytes, as :func:`check` reads them."""

    def read(self, first: int, stop: int) -> bytes | None:
        """Bytes ``first:stop``, or None if the file ends first."""
        ...


class Installed(Bytes, Protocol):
    """The installed file of a shard."""

    path: str
    ident: Ident

    def digest(self) -> int:
        """The xxh3-64 of the whole file."""
        ...


@dataclass
class Owed:
    """What was served of one shard before its install, to check against it.

    Attributes:
        spans: by the file they were read from (None: the remote), the spans served.
        decoded: the xxh3-64 of the bytes of each decoding of the whole shard served.
    """

    shard: int
    spans: dict[Ident | None, set[Span]] = field(default_factory=dict)
    decoded: set[int] = field(default_factory=set)

    @property
    def sources(self) -> set[Ident]:
        """The files spans were read from (kept open until the check)."""
        return {s for s in self.spans if s is not None}


class ServedLedger:
    """Per shard, the provenance of every record served before its install.

    One per reader, on its event loop: notes are taken as records are served, and
    :meth:`take` moves a shard's notes out before they are checked (in a thread).
    """

    def __init__(self) -> None:
        self._owed: dict[int, Owed] = {}

    def note_spans(self, shard: int, source: Ident | None, spans: Iterable[Span]) -> None:
        """Spans of ``shard`` served, read from the file ``source`` (None: the remote)."""
        owed = self._owed.setdefault(shard, Owed(shard))
        owed.spans.setdefault(source, set()).update(spans)

    def note_decoded(self, shard: int, digest: int) -> None:
        """``shard`` served from a decoding of bytes whose xxh3-64 is ``digest``."""
        self._owed.setdefault(shard, Owed(shard)).decoded.add(digest)

    def merge(self, other: ServedLedger) -> None:
        """Take over what ``other`` noted (a first batch served before this reader existed)."""
        for shard, owed in other._owed.items():
            for source, spans in owed.spans.items():
                self.note_spans(shard, source, spans)
            for digest in owed.decoded:
                self.note_decoded(shard, digest)

    def owes(self, shard: int) -> bool:
        """Whether something served of ``shard`` is not checked yet."""
        return shard in self._owed

    def shards(self) -> list[int]:
        """The shards with something owed, in order."""
        return sorted(self._owed)

    def sources(self, shard: int) -> set[Ident]:
        """The files ``shard``'s spans were read from so far."""
        owed = self._owed.get(shard)
        return set() if owed is None else owed.sources

    def take(self, shard: int) -> Owed | None:
        """What is owed of ``shard``, moved out to be checked (None: nothing)."""
        return self._owed.pop(shard, None)

    def forget(self, shard: int) -> None:
        """The download of ``shard`` failed for good: what was served is moot (its error is raised)."""
        self._owed.pop(shard, None)

    def __len__(self) -> int:
        return len(self._owed)


def same_bytes(digest: int, data: bytes) -> bool:
    """Whether ``data`` are the bytes whose xxh3-64 is ``digest``."""
    return xxhash.xxh3_64_intdigest(data) == digest


def check(owed: Owed, installed: Installed, sources: Mapping[Ident, Bytes]) -> None:
    """Check what was served of a shard (``owed``) against its ``installed`` file.

    Args:
        owed: from :meth:`ServedLedger.take`.
        installed: the shard's installed file.
        sources: the files spans were read from that are still open, by identity (a span
            noted :data:`FROM_SOURCE` is compared with its file's bytes).

    Raises:
        ServedSamplesError: a span or a decoding differs from the installed bytes.
    """
    for digest in sorted(owed.decoded):
        if installed.digest() != digest:
            raise ServedSamplesError(
                f"{installed.path}: shard {owed.shard}: its row group, served before it was installed, differs "
                "from the installed file (the source changed while it was read?); the samples handed out "
                "from it may be wrong: start the epoch again"
            )
    for source, spans in owed.spans.items():
        if source == installed.ident:
            continue  # read from the very file renamed into place: the installed bytes
        held = sources.get(source) if source is not None else None
        for first, stop, digest in sorted(spans):
            data = installed.read(first, stop)
            want = digest
            if want == FROM_SOURCE:
                old = None if held is None else held.read(first, stop)
                want = FROM_SOURCE if old is None else xxhash.xxh3_64_intdigest(old)
            if data is None or want == FROM_SOURCE or xxhash.xxh3_64_intdigest(data) != want:
                raise ServedSamplesError(
                    f"{installed.path}: bytes {first}-{stop} of the installed shard differ from those its "
                    "samples were served from while it arrived (the shard was downloaded again, or the "
                    "remote changed); samples already handed out may be wrong: restart the epoch from its "
                    "last state"
                )

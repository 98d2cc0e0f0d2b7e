"""The node agent's wire protocol, sans I/O: frames in, messages out, and back.

A frame is an 8-byte header and a JSON body::

    magic b"AS" | version u8 | reserved u8 | body length u32 (big-endian) | body

The header layout is frozen forever, so two astream versions can always tell each other
apart: a peer whose header carries another version gets :class:`VersionMismatch`, a clear
``CoordinationError``. Anything else that is not a well-formed frame carrying a
well-formed message raises :class:`ProtocolError`; the I/O layer then closes that one
connection and nothing else.

Requests carry ``op`` and, when they want an answer, an integer ``id``. Answers carry the
same ``id`` and ``ok``; a failed answer carries ``error: {"type", "message"}``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

from astream.errors import CoordinationError, ProtocolError, VersionMismatch

__all__ = [
    "HEADER",
    "PROTOCOL_VERSION",
    "FrameDecoder",
    "ProtocolError",
    "VersionMismatch",
    "encode",
    "validate_reply",
    "validate_request",
]

PROTOCOL_VERSION = 1
MAGIC = b"AS"
HEADER = struct.Struct(">2sBxI")
MAX_KEY = 4096

Message = dict[str, Any]


def version_mismatch(peer_version: int) -> VersionMismatch:
    """The error for a peer that speaks another protocol version."""
    return VersionMismatch(
        f"the peer speaks astream coordination protocol v{peer_version}, this process v{PROTOCOL_VERSION}: "
        "every process of a node must run the same astream version",
        peer_version,
    )


def encode(message: Mapping[str, Any], *, version: int = PROTOCOL_VERSION) -> bytes:
    """One frame holding ``message``."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(MAGIC, version, len(body)) + body


class FrameDecoder:
    """Incremental decoder: :meth:`feed` bytes as they arrive, get whole messages back.

    After it raised once, the decoder is broken: the connection must be closed.
    """

    def __init__(self, max_frame: int = 1 << 20) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame
        self._broken = False

    def feed(self, data: bytes) -> list[Message]:
        """Add ``data``; return the messages now complete, in order.

        Raises:
            VersionMismatch: a header names another protocol version.
            ProtocolError: bad magic, an oversized frame, or a body that is not a JSON object.
        """
        if self._broken:
            raise ProtocolError("the connection already sent a malformed frame")
        self._buffer += data
        out: list[Message] = []
        try:
            while len(self._buffer) >= HEADER.size:
                magic, version, length = HEADER.unpack_from(self._buffer)
                if magic != MAGIC:
                    raise ProtocolError(f"bad frame magic {bytes(magic)!r}: the peer does not speak astream's protocol")
                if version != PROTOCOL_VERSION:
                    raise version_mismatch(version)
                if length > self._max_frame:
                    raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self._max_frame}")
                end = HEADER.size + length
                if len(self._buffer) < end:
                    break
                body = bytes(self._buffer[HEADER.size : end])
                del self._buffer[:end]
                try:
                    message = json.loads(body)
                except (UnicodeDecodeError, ValueError) as exc:
                    raise ProtocolError(f"frame body is not JSON: {exc}") from None
                if not isinstance(message, dict):
                    raise ProtocolError(f"frame body is a {type(message).__name__}, not an object")
                out.append(message)
        except CoordinationError:
            self._broken = True
            raise
        return out


# -- message schemas -----------------------------------------------------------------

_STR, _INT, _BOOL, _NUM, _PARTIES, _STRS, _KEYS, _INTS, _OPT_BOOL, _EPOCH, _OPT_EPOCH, _OPT_STR = (
    "str", "int", "bool", "num", "parties", "strs", "keys", "ints", "bool?", "epoch", "epoch?", "str?"
)
# Every integer on the wire is a count, an id or a position: 0 <= n < 2**63 (the int64 of
# the plan's arithmetic). An epoch is also below 2**31 (it seeds the shuffle, and is
# counted up by one per epoch): a peer's -5 or 10**30 must not become the node's epoch.
MAX_INT = 2**63 - 1
MAX_EPOCH = 2**31 - 1
MAX_KEYS = 4096
MAX_USES = 16384  # shard uses per "plan" message (a reader's plan goes in several)

# op -> (fields, answer expected)
REQUESTS: dict[str, dict[str, str]] = {
    # ``view``: the identity of the dataset the client reads (absent: ""); the agent serves
    # one dataset and refuses a client of another (it would read the wrong shards).
    "hello": {"member": _STR, "pid": _INT, "epoch_hint": _OPT_EPOCH, "pins": _STRS, "view": _OPT_STR},
    # ``first``: a reader's first batch of an iteration reads these (absent: False); the
    # node fetches such shards before any reader's later ones.
    "ensure": {"key": _STR, "pin": _BOOL, "first": _OPT_BOOL},
    "ensure_many": {"keys": _KEYS, "pin": _BOOL, "first": _OPT_BOOL},
    "prefetch": {"keys": _KEYS, "first": _OPT_BOOL},
    # This connection no longer wants what it prefetched of ``keys`` (see Agent._withdraw).
    "withdraw": {"keys": _KEYS},
    "pin": {"key": _STR},
    "unpin": {"key": _STR},
    "barrier": {"name": _STR, "parties": _PARTIES, "timeout": _NUM},
    # ``epoch``: set the node's next epoch first, as ``set_epoch`` would (a resume), in the
    # same message (absent: the node's counter as it is).
    "begin_epoch": {"name": _STR, "parties": _PARTIES, "timeout": _NUM, "epoch": _OPT_EPOCH},
    "set_epoch": {"epoch": _EPOCH},
    "get_epoch": {},
    "inspect": {"key": _STR},
    # The client found ``key``'s file gone (or not as the index says) after the agent gave
    # its path: the agent checks, forgets it if so, and answers as ``ensure`` does.
    "missing": {"key": _STR},
    "inspect_barrier": {"name": _STR},
    "stats": {},
    "bye": {},
    # A reader's shard uses this epoch (``uses[j]`` read at positions ``starts[j]..ends[j]``),
    # in parts: the first replaces what the agent knew of that reader, the others add.
    "plan": {"reader": _STR, "uses": _INTS, "starts": _INTS, "ends": _INTS, "window": _INT, "first": _BOOL},
    "progress": {"reader": _STR, "position": _INT},
    "reader_done": {"reader": _STR},
}
ONE_WAY = frozenset({"pin", "unpin", "prefetch", "withdraw", "bye", "plan", "progress", "reader_done"})


def _check(value: object, kind: str) -> bool:
    if kind == _STR:
        return isinstance(value, str) and 0 < len(value) <= MAX_KEY and "\x00" not in value
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT
    if kind == _EPOCH:
        return _check(value, _INT) and value <= MAX_EPOCH  # type: ignore[operator]
    if kind == _OPT_EPOCH:
        return value is None or _check(value, _EPOCH)
    if kind == _OPT_STR:
        return value is None or value == "" or _check(value, _STR)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _OPT_BOOL:
        return value is None or isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9
    if kind == _STRS:
        return isinstance(value, list) and all(_check(v, _STR) for v in value)
    if kind == _INTS:
        return (isinstance(value, list) and len(value) <= MAX_USES
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_INT for v in value))
    if kind == _KEYS:
        return isinstance(value, list) and 0 < len(value) <= MAX_KEYS and _check(value, _STRS)
    if kind == _PARTIES:
        if isinstance(value, int) and not isinstance(value, bool):
            return 0 < value < 1 << 20
        return isinstance(value, list) and _check(value, _STRS) and 0 < len(value) == len(set(value))
    raise AssertionError(kind)


def validate_request(message: Message) -> Message:
    """Check a decoded request against its op's schema; return it unchanged.

    Raises:
        ProtocolError: unknown op, missing or mistyped field, or a missing ``id`` on an op
            that answers.
    """
    op = message.get("op")
    fields = REQUESTS.get(op) if isinstance(op, str) else None
    if fields is None:
        raise ProtocolError(f"unknown op {op!r}")
    request_id = message.get("id")
    if request_id is None:
        if op not in ONE_WAY:
            raise ProtocolError(f"op {op!r} needs an integer id")
    elif not _check(request_id, _INT):
        raise ProtocolError(f"op {op!r}: id must be an int, got {request_id!r}")
    for name, kind in fields.items():
        if not _check(message.get(name), kind):
            raise ProtocolError(f"op {op!r}: field {name!r} must be {kind}, got {message.get(name)!r}")
    return message


def validate_reply(message: Message) -> Message:
    """Check a decoded answer's envelope; return it unchanged.

    Raises:
        ProtocolError: no integer ``id``, no boolean ``ok``, or a failure without an error object.
    """
    if not _check(message.get("id"), _INT) or not isinstance(message.get("ok"), bool):
        raise ProtocolError(f"malformed answer {message!r:.200}")
    if not message["ok"]:
        error = message.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            raise ProtocolError(f"malformed error answer {message!r:.200}")
    return message

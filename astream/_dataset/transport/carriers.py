"""The carriers beside the pipe: anonymous files passed as descriptors, and the producer's credits.

Large buffers (:data:`FD_MIN_BYTES` and more, on Linux) skip the pipe as anonymous files
(``memfd_create``) whose descriptors cross a Unix socket (``SCM_RIGHTS``); the consumer
maps them (:func:`map_buffer`). The consumer acknowledges each message that carried
descriptors or a slot, and the producer's :class:`Credits` keep at most
:data:`FD_IN_FLIGHT` of those unacknowledged.
"""

from __future__ import annotations

import array
import os
import socket

from astream._dataset.transport.mapping import MappingError, map_file, mapping_supported
from astream._dataset.transport.slabs import SLAB_MIN_BYTES, RingSlot, SlabRing, is_release, layout
from astream._dataset.transport.wire import TransportError

__all__ = ["ACK", "FD_IN_FLIGHT", "FD_MIN_BYTES", "Credits", "fd_passing_supported", "make_memfd", "map_buffer",
           "recv_fds", "send_fds", "wants_fds"]

# Buffers this large or larger travel as anonymous files.
FD_MIN_BYTES = 256 * 1024
# Messages with descriptors a producer may have sent and the consumer not yet received.
FD_IN_FLIGHT = 2
_FDS_PER_SEND = 250  # the kernel takes at most 253 descriptors per message (SCM_MAX_FD)
ACK = b"\x01"


def fd_passing_supported() -> bool:
    """Whether large buffers can travel as anonymous files here."""
    return (
        mapping_supported()
        and hasattr(os, "memfd_create")
        and hasattr(socket, "CMSG_SPACE")
        and hasattr(socket, "SCM_RIGHTS")
        and hasattr(socket, "AF_UNIX")
    )


def make_memfd(raw: memoryview) -> int | None:
    """An anonymous file holding ``raw``'s bytes, or None where one cannot be made."""
    try:
        fd = os.memfd_create("astream-batch", os.MFD_CLOEXEC)
    except (OSError, AttributeError):
        return None
    try:
        done, n = 0, raw.nbytes
        while done < n:
            done += os.write(fd, raw[done:])
    except OSError:
        os.close(fd)
        return None
    return fd


def send_fds(channel: socket.socket, fds: list[int]) -> None:
    for i in range(0, len(fds), _FDS_PER_SEND):
        ancdata = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds[i : i + _FDS_PER_SEND]))]
        try:
            channel.sendmsg([ACK], ancdata)
        except BlockingIOError:  # not with the credits (a few bytes queued at most); wait if so
            blocking = channel.getblocking()
            channel.setblocking(True)
            try:
                channel.sendmsg([ACK], ancdata)
            finally:
                channel.setblocking(blocking)


class Credits:
    """The producer's count of messages with descriptors or slots the consumer has not
    acknowledged, and (with a ring) the slots it gave back."""

    def __init__(self, channel: socket.socket, ring: SlabRing | None = None) -> None:
        self.channel = channel
        self.unacked = 0
        self.ring = ring

    def take_acks(self, data: bytes) -> None:
        if not data:
            raise BrokenPipeError("the consumer closed the descriptor channel")
        acks = 0
        for byte in data:
            if is_release(byte):
                if self.ring is not None:
                    self.ring.release(byte & 0x7F)
            else:
                acks += 1
        self.unacked = max(0, self.unacked - acks)

    def drain(self) -> None:
        """Count the acknowledgements (and releases) already there, without waiting."""
        while self.unacked or (self.ring is not None and self.ring.busy):
            try:
                data = self.channel.recv(4096, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            self.take_acks(data)

    def place(self, raws: list[memoryview]) -> tuple[RingSlot | None, set[int]]:
        """Copy the slab-sized buffers of ``raws`` into a free slot of the ring, if there is one."""
        if self.ring is None:
            return None, set()
        # Small buffers (labels, ids) stay out: a user who keeps them (metrics over an
        # epoch) would otherwise hold the slot of the large ones beside them.
        wanted = [i for i, r in enumerate(raws) if r.nbytes >= SLAB_MIN_BYTES]
        if not wanted:
            return None, set()
        offsets, need = layout([raws[i].nbytes for i in wanted])
        slot = self.ring.take(need)
        if slot is None:
            return None, set()
        for i, at in zip(wanted, offsets, strict=True):
            slot.memory[at : at + raws[i].nbytes] = raws[i]  # the one copy
        return slot, set(wanted)

    def send(self, raws: list[memoryview], slot: RingSlot | None = None, in_slot: frozenset[int] = frozenset()) -> set[int]:
        """Send the slot's file if new, and the large buffers of ``raws`` not in it as files
        (credit taken if anything but the pipe carries the message); the indices sent as files."""
        fds: dict[int, int] = {}
        first = [slot.new_fd] if slot is not None and slot.new_fd is not None else []
        try:
            for i, raw in enumerate(raws):
                if raw.nbytes >= FD_MIN_BYTES and i not in in_slot:
                    fd = make_memfd(raw)
                    if fd is None:
                        break  # no files here (now): the rest go through the pipe
                    fds[i] = fd
            if fds or first:
                send_fds(self.channel, first + list(fds.values()))
            if fds or slot is not None:
                self.unacked += 1
        finally:
            for fd in [*first, *fds.values()]:
                os.close(fd)  # the consumer has its own now (or the message failed)
        return set(fds)


def wants_fds(channel: socket.socket | None, raws: list[memoryview], least: int = FD_MIN_BYTES) -> bool:
    return channel is not None and any(r.nbytes >= least for r in raws)



def recv_fds(channel: socket.socket, count: int) -> list[int]:
    fds: list[int] = []
    try:
        while len(fds) < count:
            want = min(_FDS_PER_SEND, count - len(fds))
            flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
            data, ancdata, msg_flags, _ = channel.recvmsg(1, socket.CMSG_SPACE(want * 4), flags)
            for level, kind, cdata in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(cdata[: len(cdata) - len(cdata) % got.itemsize])
                    fds.extend(got)
            if not data and not ancdata:
                raise EOFError("the producer closed the descriptor channel")
            if msg_flags & getattr(socket, "MSG_CTRUNC", 0):
                raise TransportError("descriptors of a batch were refused (too many open files?)")
        if len(fds) != count:
            raise TransportError(f"expected {count} descriptors with a batch, got {len(fds)}")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def map_buffer(fd: int, size: int) -> memoryview:
    """A writable view of the first ``size`` bytes of file ``fd``, alive as long as it is."""
    try:
        pages = map_file(fd, size)
    except MappingError as exc:
        raise TransportError(f"could not map a batch's buffer of {size} bytes: {exc.strerror}") from exc
    return memoryview(pages).cast("B")[:size]

"""``ReadAhead``: every numeric threshold of the read path, in one frozen object.

The reader, its early sources (the arriving file, ranged reads, decodings before the
install), the decoding of many batches at once and the warm start read their limits
here, at the moment they use them (``tuning.READ_AHEAD.grace_s``), so a test or a
benchmark that replaces :data:`READ_AHEAD` with ``dataclasses.replace(READ_AHEAD, ...)``
changes them all in one place. Each field's comment names the measurement that set it
(pages under ``docs/bench/``), or says that none did.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["READ_AHEAD", "ReadAhead"]


@dataclass(frozen=True)
class ReadAhead:
    """The read path's thresholds (bytes, seconds, counts)."""

    # -- decoding many batches at once (ahead.py) --------------------------------------------
    # Records decoded ahead at most (4,096 of 1 KB): workers.md, "a window's records", the
    # fixed cost per shard amortised; a larger buffer only faulted more pages (loader.md).
    ahead_bytes: int = 4 << 20
    # Mean record size above which nothing is decoded ahead: beside 32 such records a
    # shard's fixed cost is small (workers.md), and decoded images may be many times larger.
    small_record: int = 4096
    # Batches in a reader's first window (each later one doubles): the first shuffled batch
    # must not wait for a hundred more to be decoded (cold.md, first batch of a warm cache).
    first_batches: int = 4
    # Batches whose positions one stable sort groups by shard (grouping.py): workers.md,
    # "256 batches are grouped by one stable sort".
    window: int = 256

    # -- reading a shard while it arrives (arriving.py, the reader) --------------------------
    # How often a reader waiting for more bytes of an arriving file looks at it: cold.md
    # ("polls every 4 ms"; shorter polls cost CPU the download and decoder need on 2 cores).
    poll_s: float = 0.004
    # How long a shard may land before the reader turns to its arriving file: cold.md, reading
    # every run as it arrives cost +0.07/+0.2 CPU-s with no wall-time gain at load 3-4.
    grace_s: float = 0.03
    # Bytes of arrived records read at once: architecture.md, one small shard per batch cost
    # about five times a warm batch (cold.md).
    arriving_block: int = 2 << 20
    # ... and at least this much (or an eighth of the shard, or its rest) before a batch is
    # served from the arriving file (cold.md, the same runs).
    arriving_min_block: int = 1 << 20

    # -- ranged reads of a shard before its download (peek.py) -------------------------------
    # Records closer than this are fetched in one request with the bytes between them: one
    # round trip costs more than 256 KB on the loopback and LAN links of cold.md (not tuned).
    coalesce_bytes: int = 256 << 10
    # A shard's bytes read ahead of its download at most, as a fraction: past a quarter the
    # download is the better use of the link (architecture.md; chosen, not measured).
    ranged_budget: float = 0.25
    # Bytes read past the offset table in the same request, betting the records are there
    # (cold.md: the first batch of a cold cache in one round trip instead of two).
    speculate_bytes: int = 8 << 20
    # Slack added to that guess for records larger than the shard's mean (chosen, not measured).
    speculate_slack: int = 64 << 10

    # -- decodings before the install (preopen.py) -------------------------------------------
    # Row-group bytes decoded ahead of their install, from a local folder: parquet.md, a
    # resume's first batch (reading the same bytes twice costs a page-cache copy).
    preopen_bytes: int = 64 << 20
    # The same over a network, where they are fetched twice (here and by the node's
    # transfer): parquet.md, kept small so the second fetch never delays the transfer.
    preopen_network_bytes: int = 4 << 20
    # Seconds a hold keeps the node agent's start waiting for those decodings, at most:
    # parquet.md, on two cores the agent's start took the interpreter lock from the decode.
    hold_s: float = 2.0

    # -- open shards (shards.py) -------------------------------------------------------------
    # Bytes read from mapped shards after which their touched pages are handed back:
    # loader.md ("32 MB were read (RESIDENT_BUDGET)"), resident memory flat over an epoch.
    resident_bytes: int = 32 << 20
    # Decoded row groups (Parquet) kept open at most, in bytes (the most recent one always):
    # a memory bound, not a speed one (chosen, not measured).
    decoded_bytes: int = 512 << 20


# The thresholds in force: replaced whole (never mutated) by a test or a benchmark.
READ_AHEAD = ReadAhead()

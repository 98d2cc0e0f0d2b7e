"""Partitioning of an epoch's positions over nodes, ranks, workers and batches.

MosaicML builds the whole ``(nodes, ranks, workers, batches, batch_size)`` tensor by
reshaping, transposing and concatenating O(epoch) arrays. The layout is pure index
arithmetic, so here every entry is *computed* from its coordinates: one worker's
sequence costs O(its length), and the full tensor is filled chunk by chunk into one
output array. The arithmetic follows MosaicML's steps (spec section 4.4):

1. the epoch's positions form a ``C x S'`` matrix, row ``i`` holding canonical node
   ``i``'s range ``[i*N//C, (i+1)*N//C)`` (a short row repeats its last id, and when
   ``C < P`` each row is padded to a multiple of ``P/C`` with copies of earlier columns);
2. the matrix is read column by column (canonical nodes interleaved), the first
   ``drop_first`` entries are dropped, and entry ``t`` goes to node ``t % P``;
3. a node's list is padded to a multiple of ``R`` (copies of its tail) and dealt to ranks
   round-robin; a rank's list is padded with -1 to a multiple of ``W*B`` and cut into
   chunks of ``W*B``, worker ``w`` taking ``[w*B, (w+1)*B)`` of each chunk as a batch.

``relaxed`` with a node count that does not fit the canonical nodes partitions for the
initial node count with the per-device batch that keeps the global batch, and re-deals
that traversal order (batch, worker, node, rank, sample) over the new world.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from astream._sampling.defaults import PARTITION_ALGOS
from astream._sampling.validation import check_choice, check_int, check_optional_int
from astream._sampling.warnings import SamplingWarning
from astream.errors import ConfigError

__all__ = ["Partition", "get_partitions", "layout_world", "make_partition"]

Int64Array = NDArray[np.int64]
logger = logging.getLogger(__name__)



def _divisibility_error(num_canonical_nodes: int, num_physical_nodes: int) -> ConfigError:
    return ConfigError(
        f"num_canonical_nodes={num_canonical_nodes} and num_physical_nodes={num_physical_nodes}: "
        f"one must divide the other (otherwise every node would download every shard); choose "
        f"num_canonical_nodes as a multiple or a divisor of the node count"
    )


@dataclass(frozen=True)
class _Orig:
    """MosaicML's ``orig`` layout, as constants of closed-form index arithmetic."""

    num_samples: int
    ncn: int
    nodes: int
    ranks: int
    workers: int
    batch: int
    drop: int  # drop_first, rounded down to a multiple of the node count
    row: int  # S = ceil(N / C), real columns of the C x S' matrix
    pad: int  # S' - S, padding columns (only when C < P)
    pad_src: int  # first source column of the padding columns
    pad_src_width: int  # pad (one source per padding column) or 1 (broadcast of one column)
    degenerate: bool  # fewer samples than canonical nodes: the matrix tiles 0..N-1
    node_len: int  # L, entries per node before rank padding
    rank_pad: int  # u, entries appended to each node's list
    rank_pad_tiles: bool  # the appended entries tile the list instead of copying its tail
    rank_len: int  # entries per rank before -1 padding
    batches: int  # batches per worker

    @classmethod
    def build(cls, n: int, c: int, p: int, r: int, w: int, b: int, drop: int) -> _Orig:
        if (c < p and p % c) or (p < c and c % p):
            raise _divisibility_error(c, p)
        if drop % p:
            logger.warning("drop_first=%d is not a multiple of the node count %d; rounding down", drop, p)
            drop -= drop % p
        row = -(-n // c)
        pad = 0
        if c < p:
            ratio = p // c
            pad = (ratio - row % ratio) % ratio
        width = row + pad
        pad_src, pad_src_width = 0, 0
        # With too few samples MosaicML tiles 0..N-1 over the matrix instead (no copying).
        degenerate = not (n > c or (n == c and c >= p))
        if pad and not degenerate:
            # MosaicML copies columns [-2*pad-ratio+1, -pad-ratio+1) of each row with a
            # NumPy slice: Python's index clamping applies, and a slice of one column
            # broadcasts. Any other width is the broadcast error MosaicML raises.
            cols = range(width)[-2 * pad - ratio + 1 : -pad - ratio + 1]
            if len(cols) not in (pad, 1):
                raise ConfigError(
                    f"num_samples={n} is too small to partition over num_canonical_nodes={c} "
                    f"canonical and num_physical_nodes={p} physical nodes (MosaicML fails here too)"
                )
            pad_src, pad_src_width = cols.start, len(cols)
        if degenerate:
            if n == 0:
                raise ConfigError("num_samples must be positive to partition an epoch")
            warnings.warn(
                f"partitioning {n} samples over {c} canonical nodes repeats many samples; check "
                f"the dataset size or reduce num_canonical_nodes",
                SamplingWarning,
                stacklevel=4,
            )
        node_len = max(c * width - drop, 0) // p
        rank_pad = (r - node_len % r) % r
        tiles = bool(rank_pad) and r + rank_pad - 1 > node_len
        if tiles:
            warnings.warn(
                f"partitioning {node_len} samples per node over {r} ranks repeats many samples",
                SamplingWarning,
                stacklevel=4,
            )
        rank_len = (node_len + rank_pad) // r
        batches = -(-rank_len // (w * b))
        return cls(n, c, p, r, w, b, drop, row, pad, pad_src, pad_src_width, degenerate,
                   node_len, rank_pad, tiles, rank_len, batches)

    def interleaved(self) -> Int64Array:
        """The ``C x S'`` matrix read column by column (step 2), before ``drop_first``.

        Built directly in column-major order, one O(epoch) array, no transposed copies.
        """
        c, width = self.ncn, self.row + self.pad
        cols = np.arange(width, dtype=np.int64)[:, None]
        rows = np.arange(c, dtype=np.int64)[None, :]
        if self.degenerate:
            return ((rows * width + cols) % self.num_samples).reshape(-1)
        starts = rows * self.num_samples // c
        out = (cols + starts).reshape(-1)
        stops = (rows + 1) * self.num_samples // c
        short = np.flatnonzero((stops - starts)[0] < self.row)
        out[(self.row - 1) * c + short] -= 1
        for col in range(self.row, width):
            src = self.pad_src + min(col - self.row, self.pad_src_width - 1)
            out[col * c : (col + 1) * c] = out[src * c : (src + 1) * c]
        return out

    def fill(self, out: Int64Array) -> None:
        """Write the whole ``(P, R, W, batches, B)`` tensor into ``out`` (C-contiguous).

        Rank ``(p, r)`` reads the interleaved list with stride ``R*P`` from ``r*P + p``;
        only the last entry of a rank can be a rank-padding copy, computed separately.
        """
        flat = self.interleaved()[self.drop :]
        nodes, ranks, w, b = self.nodes, self.ranks, self.workers, self.batch
        chunk = w * b
        for p in range(nodes):
            for r in range(ranks):
                main = max(-(-(self.node_len - r) // ranks), 0)  # entries with k*R + r < L
                main = min(main, self.rank_len)
                seq = flat[r * nodes + p :: ranks * nodes][:main]
                dest = out[p, r].transpose(1, 0, 2)  # (batches, workers, B) view
                whole = main // chunk
                dest[:whole] = seq[: whole * chunk].reshape(whole, w, b)
                tail_k = np.arange(whole * chunk, self.batches * chunk, dtype=np.int64)
                if len(tail_k):
                    tail = self.values(p, r, tail_k)
                    dest[whole:] = tail.reshape(-1, w, b)

    def values(self, node: Int64Array | int, rank: Int64Array | int, k: Int64Array) -> Int64Array:
        """Entry ``k`` of rank ``(node, rank)``'s list (``-1`` past its end)."""
        # In-place steps and per-row tables: this runs over a whole worker's sequence
        # before its first batch (200k entries: ~8 ms with a temporary per step).
        m = k * self.ranks
        m += rank  # index in the node's rank-padded list
        if self.rank_pad:
            extra = m - self.node_len
            src = extra % max(self.node_len, 1) if self.rank_pad_tiles else extra + (
                self.node_len - self.ranks - self.rank_pad + 1)
            m = np.where(extra >= 0, src, m)
        q = m
        if self.nodes != 1:
            q *= self.nodes
        q += node
        if self.drop:
            q += self.drop  # position in the column-major matrix read
        if self.ncn == 1 and not self.degenerate and not self.pad:
            # One canonical node (the default of a single-node run): one row of every
            # sample, so the entry is its column (skips a divide over the whole sequence).
            out = q
        elif self.degenerate:
            col, row = np.divmod(q, self.ncn)
            width = self.row + self.pad
            out = (row * width + col) % self.num_samples
        else:
            col, row = np.divmod(q, self.ncn)
            if self.pad:
                shift = np.minimum(col - self.row, self.pad_src_width - 1) + self.pad_src
                col = np.where(col >= self.row, shift, col)
            bounds = np.arange(self.ncn + 1, dtype=np.int64) * self.num_samples // self.ncn
            short_rows = np.diff(bounds) < self.row
            # A short row repeats its last real id in its final real column.
            repeat = short_rows[row] & (col == self.row - 1) if short_rows.any() else None
            out = col
            out += bounds[:-1][row]
            if repeat is not None:
                out -= repeat
        if len(k) and int(k.max()) >= self.rank_len:
            out[k >= self.rank_len] = -1
        return out.astype(np.int64, copy=False)


@dataclass(frozen=True)
class Partition:
    """A partition tensor, computable whole or one worker at a time.

    Attributes:
        shape: ``(nodes, ranks per node, workers per rank, batches per worker, batch size)``.
    """

    shape: tuple[int, int, int, int, int]
    _base: _Orig

    def _at(self, node: int, rank: int, worker: int, batch_lo: int, batch_hi: int) -> Int64Array:
        """Entries of batches ``[batch_lo, batch_hi)`` of one worker, flattened."""
        nodes, ranks, workers, _, size = self.shape
        j = np.arange(batch_lo, batch_hi, dtype=np.int64)[:, None]
        b = np.arange(size, dtype=np.int64)[None, :]
        base = self._base
        if (nodes, size) == (base.nodes, base.batch):
            k = (j * workers + worker) * size + b
            return base.values(node, rank, k).reshape(-1)
        # Re-dealt relaxed layout: find each entry's place in the traversal order, then its
        # coordinates in the initial layout.
        t = (((j * workers + worker) * nodes + node) * ranks + rank) * size + b
        t, b0 = np.divmod(t, base.batch)
        t, r0 = np.divmod(t, ranks)
        t, p0 = np.divmod(t, base.nodes)
        j0, w0 = np.divmod(t, workers)
        return base.values(p0, r0, (j0 * workers + w0) * base.batch + b0).reshape(-1)

    def worker(self, node: int, rank: int, worker: int) -> Int64Array:
        """One worker's entries, batch after batch (MosaicML's ``work[node, rank, worker]``)."""
        return self._at(node, rank, worker, 0, self.shape[3])

    def worker_batches(self, node: int, rank: int, worker: int, batch_lo: int, batch_hi: int) -> Int64Array:
        """Entries of batches ``[batch_lo, batch_hi)`` of one worker: that part of :meth:`worker`."""
        return self._at(node, rank, worker, batch_lo, batch_hi)

    def array(self) -> Int64Array:
        """The whole int64 tensor."""
        out = np.empty(self.shape, np.int64)
        base = self._base
        if (self.shape[0], self.shape[4]) == (base.nodes, base.batch):
            base.fill(out)
            return out
        # Re-dealt relaxed layout: each (batch, worker) step covers one global batch in both
        # layouts, in (node, rank, sample) order, so the steps are copied over reshaped.
        nodes, ranks, workers, batches, size = self.shape
        initial = np.empty((base.nodes, ranks, workers, batches, base.batch), np.int64)
        base.fill(initial)
        for w in range(workers):
            step = initial[:, :, w].transpose(2, 0, 1, 3).reshape(batches, nodes, ranks, size)
            out[:, :, w].transpose(2, 0, 1, 3)[...] = step
        return out


def make_partition(
    algo: str,
    num_samples: int,
    num_canonical_nodes: int,
    num_physical_nodes: int,
    ranks_per_node: int,
    workers_per_rank: int,
    batch_size: int,
    drop_first: int = 0,
    initial_physical_nodes: int | None = None,
) -> Partition:
    """Validate the parameters and return the lazy :class:`Partition` (see get_partitions)."""
    check_choice("partition_algo", algo, PARTITION_ALGOS)
    n = check_int("num_samples", num_samples, 0)
    c = check_int("num_canonical_nodes", num_canonical_nodes, 1)
    p = check_int("num_physical_nodes", num_physical_nodes, 1)
    r = check_int("ranks_per_node", ranks_per_node, 1)
    w = check_int("workers_per_rank", workers_per_rank, 1)
    b = check_int("batch_size", batch_size, 1)
    d = check_int("drop_first (sample_in_epoch)", drop_first, 0)
    p0 = check_optional_int("initial_physical_nodes", initial_physical_nodes, 1)
    world = p * r
    # MosaicML's bound: the epoch padded up to a multiple of the world size, where an
    # already divisible epoch still counts one more world of repeats.
    if n + world - n % world < d:
        raise ConfigError(
            f"sample_in_epoch (drop_first)={d} is beyond the end of the epoch ({n} samples); "
            f"the resumption state does not belong to this dataset"
        )
    nodes, batch = layout_world(algo, c, p, r, b, p0)
    base = _Orig.build(n, c, nodes, r, w, batch, d)
    return Partition((p, r, w, base.batches, b), base)


def layout_world(
    algo: str, num_canonical_nodes: int, num_physical_nodes: int, ranks_per_node: int, batch_size: int,
    initial_physical_nodes: int | None,
) -> tuple[int, int]:
    """The (nodes, per-device batch) the ``orig`` layout is computed for; checks the world.

    ``relaxed`` on a node count that does not fit the canonical nodes uses the initial node
    count and the per-device batch that keeps the global batch.

    Raises:
        ConfigError: canonical and physical node counts that do not divide one another, or a
            global batch the initial devices cannot share.
    """
    c, p, r, b, p0 = num_canonical_nodes, num_physical_nodes, ranks_per_node, batch_size, initial_physical_nodes
    fits = (p <= c and c % p == 0) or (p > c and p % c == 0)
    if algo == "orig" or p0 is None or fits:
        if not fits:
            raise _divisibility_error(c, p)
        return p, b
    global_batch = p * r * b
    if global_batch % (p0 * r):
        raise ConfigError(
            f"the global batch {global_batch} (num_physical_nodes={p} x ranks_per_node={r} x "
            f"batch_size={b}) is not divisible by the initial device count {p0 * r} "
            f"(initial_physical_nodes={p0}); keep the global batch size constant when resuming"
        )
    if (c < p0 and p0 % c) or (p0 < c and c % p0):
        raise _divisibility_error(c, p0)
    return p0, global_batch // (p0 * r)


def get_partitions(
    algo: str,
    num_samples: int,
    num_canonical_nodes: int,
    num_physical_nodes: int,
    ranks_per_node: int,
    workers_per_rank: int,
    batch_size: int,
    drop_first: int = 0,
    initial_physical_nodes: int | None = None,
) -> Int64Array:
    """Partition an epoch's positions over nodes, ranks, workers and batches.

    Identical to MosaicML Streaming 0.13's function of this name.

    Args:
        algo: ``orig`` or ``relaxed``.
        num_samples: epoch size N (positions ``0..N-1``).
        num_canonical_nodes: canonical node count C.
        num_physical_nodes: physical node count P; under ``orig`` (and ``relaxed`` on a
            first run) P must divide C or be divisible by it.
        ranks_per_node: ranks per node R.
        workers_per_rank: workers per rank W.
        batch_size: per-device batch size B.
        drop_first: positions already consumed (``sample_in_epoch`` when resuming).
        initial_physical_nodes: P of the first run of this training (``relaxed`` only).

    Returns:
        int64 array of shape ``(P, R, W, batches per worker, B)``; ``-1`` pads.

    Raises:
        ConfigError: incompatible node counts, a global batch that does not fit the initial
            devices, ``drop_first`` past the epoch, or an out-of-range parameter.
    """
    return make_partition(
        algo, num_samples, num_canonical_nodes, num_physical_nodes, ranks_per_node,
        workers_per_rank, batch_size, drop_first, initial_physical_nodes,
    ).array()

"""Reading one worker's batches of an epoch.

``reader.py`` (the loop: leases asked for ahead, each batch read once its records can
be), ``leases.py`` (``LeaseBook``: the lease table, the request order and its ``first``
mark, the releases; pure), ``ledger.py`` (``ServedLedger``: what was served before its
shard's install, and the one check of it; pure) with its I/O in ``installed.py``, the early
sources (``arriving.py``: the file being written; ``peek.py``: ranged reads of the remote),
``shards.py`` (open shard maps), ``ahead.py`` and ``grouping.py`` (many batches decoded or
grouped at once), ``collate.py`` and ``samples.py`` (assembly of a batch).
"""

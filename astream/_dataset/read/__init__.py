"""Reading one worker's batches of an epoch.

``reader.py`` (the loop), ``leases.py`` (``LeaseBook``: the lease table, the request order
and its ``first`` mark, the releases; pure) with its I/O in ``requests.py``
(``LeaseRequests``), ``ledger.py`` (``ServedLedger``: what was served before its shard's
install, and the one check of it; pure) with its I/O in ``installed.py`` and
``checking.py`` (``ServedChecks``), ``sources.py`` (the seam: ``ShardSource``, ``race``, the
installed file and the decodings offered), ``policy.py`` (``SourcePolicy``: which early
source applies to which shard, the one place), ``early_reads.py`` (``EarlyReads``: the
order in which a batch tries them) over the sources ``arriving.py`` (the file being
written) and ``peek.py`` (ranged reads of the remote, through the one ``RangedReader`` of
``ranged.py``), ``records.py`` (records served early as a small shard), ``shards.py``
(open shard maps), and the assembly of a batch: ``assembly.py``, ``ahead.py`` and ``grouping.py``
(many batches decoded or grouped at once), ``collate.py`` and ``samples.py``;
``substitutes.py`` (``on_bad_sample="skip"``: the one point where bad samples are replaced).
"""

"""Parquet files read in place: each row group is a virtual shard.

Pure and synchronous like the rest of ``_format`` (the I/O that lists files and reads
their footers is in :mod:`astream._cache.parquet_index`). ``footer.py`` turns a file's
footer into its row groups and the byte ranges of their column chunks, ``build.py`` the
footers of a dataset's files into an ``index.json`` whose shards are row groups, and
``reader.py`` reads a cached row group (its projected column chunks and the file's
footer) as a :class:`~astream._format.kinds.SampleSource`. pyarrow (extra ``parquet``)
is imported only when a Parquet stream is used.
"""

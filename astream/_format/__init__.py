"""The MDS format: encodings, codecs, hashes, index.json, shard reading and writing.

Pure and synchronous: nothing here opens a socket or needs an event loop. The public
classes (``MDSWriter``, ``LocalDataset``) are re-exported by ``astream``.
"""

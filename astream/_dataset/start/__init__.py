"""The start-up prelude: what happens between ``Loader()`` and the first batch.

``warmup.py`` (``WarmStart``: the node joined in the background, the first batches'
shards prefetched, the hold of the node's start while a first batch is decoded),
``preopen.py`` (a resume's first row groups decoded at ``load_state_dict``) and
``early.py`` (a resume's first batch taken from those decodings before the iteration
joins the node: batch 0 of the same order the reader then reads).
"""

"""The start-up prelude: what happens between ``Loader()`` and the first batch.

``prelude.py`` (``Prelude``: the node joined in the background, the first batches' shards
prefetched, a loaded position's prefetch and read-ahead, the holds of the node's start, and
batch 0 of the iteration's reader read before the join), ``stages.py`` (its state: one
``Stage`` and the transitions between them, pure) and ``preopen.py`` (a resume's first row
groups decoded at ``load_state_dict``, the read-ahead the prelude triggers).
"""

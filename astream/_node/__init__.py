"""Code that runs in the node agent: the shard provider over the cache engine, and the
rules for what a bounded cache can hold.

Between ``_coord`` (whose agent calls the provider through its ``ShardProvider`` seam) and
``_cache`` (the engine it drives) on one side, and ``_sampling`` and ``_dataset`` on the other:
it imports neither of those (tests/test_layers.py).
"""

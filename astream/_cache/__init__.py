"""Layer 4: the node's shard cache, its download engine and the eviction policy. See DESIGN.md."""

from astream._cache.cache import ShardCache, State
from astream._cache.engine import ShardEngine
from astream._cache.eviction import Candidate, choose_victims
from astream._cache.index_file import load_index
from astream._cache.stats import CacheStats
from astream._cache.throttle import Aimd

__all__ = [
    "Aimd",
    "CacheStats",
    "Candidate",
    "ShardCache",
    "ShardEngine",
    "State",
    "choose_victims",
    "load_index",
]

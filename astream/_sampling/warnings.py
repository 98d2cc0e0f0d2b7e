"""The warning category of the sampling layer."""

from __future__ import annotations

__all__ = ["SamplingWarning"]


class SamplingWarning(UserWarning):
    """A sampling configuration works, but less well than it could (repeats, poor mixing)."""

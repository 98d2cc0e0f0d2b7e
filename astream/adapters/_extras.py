"""Optional-dependency checks shared by the adapters."""

from __future__ import annotations

import importlib.util

from astream.errors import MissingExtraError

__all__ = ["require"]


def require(module: str, feature: str, extra: str) -> None:
    """Fail early, without importing ``module``, when it is not installed.

    Finding the module spec is cheap and has no side effects, which matters for Keras:
    its backend is chosen once, at its first import, from ``KERAS_BACKEND``.

    Raises:
        MissingExtraError: ``module`` cannot be found; the message names the extra.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError(feature, extra, module)

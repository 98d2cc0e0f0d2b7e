"""``AsyncResource``: the one base of astream's objects that hold connections, files or tasks.

Every such object is an async context manager whose ``aclose()`` is idempotent, and warns
with ``ResourceWarning`` when it is garbage collected while still holding something (a
forgotten close), as aiohttp's sessions do. A subclass says what opening means
(:meth:`_aopen`, default nothing), closes in :meth:`aclose`, and says when a forgotten
close matters (:meth:`_unclosed`).
"""

from __future__ import annotations

import warnings
from types import TracebackType
from typing import TypeVar

__all__ = ["AsyncResource"]

R = TypeVar("R", bound="AsyncResource")


class AsyncResource:
    """Base of async context managers that release what they hold in ``aclose()``."""

    async def _aopen(self) -> None:
        """Acquire what ``async with`` should acquire before the body runs (default: nothing)."""

    async def aclose(self) -> None:
        """Release everything; idempotent."""
        raise NotImplementedError

    def _unclosed(self) -> bool:
        """True while the object holds what a close would release (then collection warns)."""
        return False

    async def __aenter__(self: R) -> R:
        await self._aopen()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        try:
            unclosed = self._unclosed()
        except AttributeError:  # collected before __init__ finished
            return
        if unclosed:
            warnings.warn(
                f"{type(self).__name__} was not closed; use `async with` or call `await ....aclose()`",
                ResourceWarning, stacklevel=2,
            )

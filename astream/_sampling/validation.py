"""Checks of sampling parameters (the package-wide ones of :mod:`astream._checks`)."""

from __future__ import annotations

from astream._checks import check_choice, check_int, check_optional_int, check_seconds

__all__ = ["check_choice", "check_int", "check_optional_int", "check_seconds"]

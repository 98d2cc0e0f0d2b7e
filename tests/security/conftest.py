"""Fixtures of the hostile-input tests (issue 32): an S3 bucket on moto's server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from astream.testing import moto_s3


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with moto_s3("hostile") as client:
        yield client

"""Arrow lists to NumPy rows, column-wise: every depth, fixed or variable, sliced anywhere."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from astream.convert import arrow_columns
from astream.convert._types import batch_samples
from astream.errors import SampleError


@st.composite
def _arrays(draw: st.DrawFn) -> tuple[list[np.ndarray], bool, int, int]:
    ndim = draw(st.integers(1, 3))
    fixed = draw(st.booleans())
    n = draw(st.integers(1, 8))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    rows = []
    for i in range(n):
        row_shape = shape if fixed else tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
        rows.append((np.arange(int(np.prod(row_shape)), dtype=np.float32) + 100 * i).reshape(row_shape))
    start = draw(st.integers(0, n - 1))
    stop = draw(st.integers(start + 1, n))
    return rows, fixed, start, stop


def _arrow(rows: list[np.ndarray], fixed: bool) -> pa.Array:
    kind: pa.DataType = pa.float32()
    for d in reversed(rows[0].shape):
        kind = pa.list_(kind, d) if fixed else pa.list_(kind)
    return pa.array([r.tolist() for r in rows], kind)


@given(_arrays())
def test_nested_lists_become_arrays_of_their_shape(case: tuple[list[np.ndarray], bool, int, int]) -> None:
    rows, fixed, start, stop = case
    batch = pa.record_batch([_arrow(rows, fixed)], names=["x"]).slice(start, stop - start)
    columns = arrow_columns(batch.schema)
    assert columns["x"] == ("ndarray:float32:" + ",".join(map(str, rows[0].shape)) if fixed else "ndarray:float32")
    got = [s["x"] for s in batch_samples(batch, columns)]
    assert len(got) == stop - start
    for value, want in zip(got, rows[start:stop], strict=True):
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, want)


def test_a_ragged_row_is_refused_naming_the_column() -> None:
    batch = pa.record_batch([pa.array([[[1.0, 2.0], [3.0]]])], names=["g"])
    with pytest.raises(SampleError, match=r"column 'g' .* row 0 is ragged"):
        list(batch_samples(batch, arrow_columns(batch.schema)))

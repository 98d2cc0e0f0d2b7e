"""Arrow lists to NumPy rows, column-wise: every depth, fixed or variable, sliced anywhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from astream.convert import arrow_columns
from astream.convert._types import batch_samples
from astream.errors import ConfigError, SampleError


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


@pytest.mark.parametrize(("rows", "kind", "encoding", "match"), [
    ([[1, 2], [3, 4], [1000, 70000]], pa.int64(), "ndarray:int8:2", r"^row 2: .* it holds 1000, and int8 holds -128\.\.127"),
    ([[1.0], [1e300, 1.0]], pa.float64(), "ndarray:float16", r"^row 1: .* it holds 1e\+300, and float16 cannot hold"),
    ([[70000]], pa.int32(), "ndarray:float16", r"^row 0: .* it holds 70000, and float16 cannot hold"),
    ([[0], [-1]], pa.int16(), "ndarray:uint8", r"^row 1: .* it holds -1, and uint8 holds 0\.\.255"),
    ([[1.5]], pa.float32(), "ndarray:int32", r"^row 0: .* int32 holds integers, and the lists hold float32 values"),
])
def test_an_array_value_its_dtype_cannot_hold_is_refused(rows: list[list[float]], kind: pa.DataType, encoding: str,
                                                          match: str) -> None:
    # The scalar encoders and MDSWriter refuse such values; an array column must not wrap them.
    batch = pa.record_batch([pa.array(rows, pa.list_(kind))], names=["a"])
    with pytest.raises(SampleError, match=match):
        list(batch_samples(batch, {"a": encoding}))


def test_array_values_that_fit_another_dtype_are_cast_and_a_slice_checks_only_its_rows() -> None:
    batch = pa.record_batch([pa.array([[1000], [1, -2], [3]], pa.list_(pa.int64()))], names=["a"])
    got = [s["a"] for s in batch_samples(batch.slice(1, 2), {"a": "ndarray:int8"})]
    assert [g.dtype for g in got] == [np.int8, np.int8]
    assert [g.tolist() for g in got] == [[1, -2], [3]]
    floats = pa.record_batch([pa.array([[0.1, float("inf")]], pa.list_(pa.float64()))], names=["f"])
    (value,) = [s["f"] for s in batch_samples(floats, {"f": "ndarray:float16"})]
    assert value.dtype == np.float16
    assert np.isinf(value[1])  # inf stays inf: only overflow is refused


def test_write_partition_refuses_an_overflowing_array_column(tmp_path: Path) -> None:
    from astream.convert import write_partition

    table = pa.table({"a": pa.array([[1, 2], [1000, 70000]], pa.list_(pa.int64()))})
    with pytest.raises(SampleError, match=r"int8 holds -128\.\.127"):
        write_partition(table, str(tmp_path / "ds"), 0, {"a": "ndarray:int8:2"})
    assert not (tmp_path / "ds" / "part-00000" / "index.json").exists()


@pytest.mark.parametrize(("kind", "ok"), [
    (pa.map_(pa.string(), pa.int64()), True),
    (pa.struct([("a", pa.list_(pa.string())), ("b", pa.float32())]), True),
    (pa.list_(pa.struct([("a", pa.int8())])), True),
    (pa.map_(pa.string(), pa.binary()), False),
    (pa.struct([("a", pa.int8()), ("when", pa.timestamp("s"))]), False),
    (pa.list_(pa.struct([("d", pa.decimal128(5, 2))])), False),
])
def test_a_nested_type_is_json_only_if_every_value_is(kind: pa.DataType, ok: bool) -> None:
    schema = pa.schema([("m", kind)])
    if ok:
        assert arrow_columns(schema) == {"m": "json"}
        return
    with pytest.raises(ConfigError, match=r"column 'm' has Arrow type .*which MDS cannot store \(a struct"):
        arrow_columns(schema)
    with pytest.raises(ConfigError, match="not all JSON-serialisable"):
        arrow_columns(schema, {"m": "json"})
    assert arrow_columns(schema, {"m": "pkl"}) == {"m": "pkl"}

"""An image column decodes only the format it declares (issue 32, finding 6): a ``jpeg``
column holding PNG, WebP or EPS bytes, or a ``png`` one holding a JPEG, is an
EncodingError, and EPS never reaches Pillow's EPS plugin (which runs Ghostscript)."""

from __future__ import annotations

import io
import struct

import pytest

from astream._format.encodings import get_encoding
from astream.errors import EncodingError

Image = pytest.importorskip("PIL.Image", reason="Pillow (the image extra) is not installed")

EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 4 4\n0 0 moveto 4 4 lineto stroke\nshowpage\n%%EOF\n"


def _file(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(out, format=fmt)
    return out.getvalue()


def _items(*items: bytes) -> bytes:
    """``count, sizes..., items...`` as list and array encodings store them."""
    return struct.pack(f"<I{len(items)}I", len(items), *map(len, items)) + b"".join(items)


@pytest.mark.parametrize(("column", "fmt"), [("jpeg", "PNG"), ("jpeg", "WEBP"), ("jpeg", "GIF"), ("png", "JPEG"),
                                             ("png", "BMP")])
def test_another_format_is_refused(column: str, fmt: str) -> None:
    with pytest.raises(EncodingError, match=rf"as '{column}'"):
        get_encoding(column).decode(_file(fmt))


@pytest.mark.parametrize("column", ["jpeg", "png", "list[jpeg]", "jpeg_array"])
def test_eps_never_reaches_its_plugin(column: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import EpsImagePlugin

    reached: list[str] = []  # Pillow swallows a plugin's errors and tries the next: record instead

    def opened(*args: object, **kwargs: object) -> None:
        reached.append("EpsImageFile._open")
        raise SyntaxError("not here")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", opened)
    data = {"list[jpeg]": b"\0\0\0\0" + _items(EPS), "jpeg_array": _items(EPS)}.get(column, EPS)
    with pytest.raises(EncodingError):
        get_encoding(column).decode(data)
    assert reached == []


@pytest.mark.parametrize(("column", "fmt"), [("jpeg", "JPEG"), ("png", "PNG")])
def test_the_declared_format_decodes(column: str, fmt: str) -> None:
    assert get_encoding(column).decode(_file(fmt)).size == (4, 4)

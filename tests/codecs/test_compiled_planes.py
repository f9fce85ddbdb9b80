"""The package's compiled loops (deltackpt/codecs/_planes.c): built wherever a C compiler is,
the same bytes as numpy's passes on every width and length, each plane read where it lies, and
every length checked before a byte is written."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from deltackpt.codecs import bytegroup, native_planes
from tests.codecs.test_native_planes import PLANE_ORDERS, mixed_planes

compiled = pytest.mark.skipif(not native_planes.compiled(), reason="the compiled loops were not built")


def test_the_loops_are_built_where_a_compiler_is():
    """The extension is optional at install, so a broken build would only show as slower loads:
    here, where a compiler and Python's headers are, it must have been built."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which("cc") is None or not headers.exists():
        pytest.skip("no C compiler or no Python headers: the package installs without the loops")
    assert native_planes.compiled()


def _numpy(fn, *args, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(native_planes, "_planes", None)
        m.setattr(native_planes, "_c_blosc", lambda: None)
        return fn(*args)


@compiled
@pytest.mark.parametrize("width", [2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 1000, 1 << 17])
def test_group_and_interleave_give_numpy_s_bytes(width, n, monkeypatch):
    data = np.random.default_rng(width * 1000 + n).integers(0, 256, width * n, dtype=np.uint8)
    planes = bytegroup.group(data, width)
    assert planes.tobytes() == _numpy(bytegroup.group, data, width, monkeypatch=monkeypatch).tobytes()
    assert planes.tobytes() == data.reshape(n, width).T.tobytes()
    out = np.zeros_like(data)
    native_planes.interleave_from([planes[k] for k in range(width)], out)
    assert out.tobytes() == data.tobytes()


@compiled
@pytest.mark.parametrize("order", PLANE_ORDERS)
def test_a_payload_decodes_to_the_same_bytes_on_every_path(order, monkeypatch):
    """Raw planes read where they lie in a read-only payload (bytes, as a pack mapped into memory
    is), zstd planes decompressed into the thread's buffer: the bytes of numpy's path and of
    c-blosc's."""
    data, params, payload = mixed_planes(order)
    got = bytegroup.decode_planes(params, payload, len(data), what="t").tobytes()
    numpy = _numpy(lambda: bytegroup.decode_planes(params, payload, len(data), what="t"), monkeypatch=monkeypatch)
    assert got == data.tobytes() == numpy.tobytes()
    if native_planes.available():
        with monkeypatch.context() as m:
            m.setattr(native_planes, "_planes", None)
            assert bytegroup.decode_planes(params, payload, len(data), what="t").tobytes() == got


@compiled
def test_every_length_is_checked_before_anything_is_written():
    from deltackpt.codecs import _planes
    out = np.zeros(4 * 64, np.uint8)
    plane = np.ones(64, np.uint8)
    with pytest.raises(ValueError, match="plane 3 holds 63 bytes"):
        _planes.interleave(out, [plane, plane, plane, plane[:63]])
    with pytest.raises(ValueError, match="1 to 16 planes"):
        _planes.interleave(out, [])
    with pytest.raises(ValueError, match="1 to 16 planes"):
        _planes.interleave(np.zeros(17 * 64, np.uint8), [plane] * 17)
    with pytest.raises(ValueError, match="not 3 planes"):
        _planes.interleave(out, [plane] * 3)
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        _planes.interleave(out, [plane, plane, plane, np.ones(128, np.uint8)[::2]])
    with pytest.raises(BufferError, match="not writable"):
        _planes.interleave(bytes(4 * 64), [plane] * 4)   # a destination that cannot be written
    with pytest.raises(ValueError, match="group of 256 bytes into 255 bytes"):
        _planes.group(out, np.zeros(255, np.uint8), 4)
    with pytest.raises(ValueError, match="1 to 16 planes"):
        _planes.group(out, np.zeros(256, np.uint8), 0)
    assert not out.any()

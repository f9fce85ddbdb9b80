"""Byte planes interleaved by c-blosc (deltackpt/codecs/native_planes.py) give the bytes the numpy
path gives, on every width, plane length and block layout, and what c-blosc cannot take goes to
the numpy path.  c-blosc is the path where the package's compiled loops were not built, so every
test here runs without them (tests/codecs/test_compiled_planes.py tests those)."""

from __future__ import annotations

import numpy as np
import pytest

from deltackpt.codecs import bytegroup, native_planes
from deltackpt.errors import CorruptObjectError

pytestmark = pytest.mark.skipif(not native_planes.available(), reason="python-blosc is not installed")


@pytest.fixture(autouse=True)
def _without_compiled_loops(monkeypatch):
    monkeypatch.setattr(native_planes, "_planes", None)


def _numpy_decode(params, payload, raw_len, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(native_planes, "_c_blosc", lambda: None)
        return bytegroup.decode_planes(params, payload, raw_len, what="t").tobytes()


def _weights(count: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(count) * 0.02).astype(np.float32)


def _spy(monkeypatch) -> list[bool]:
    """Record what each native attempt returned (False too for a chunk given to numpy at once)."""
    seen: list[bool] = []
    real_frame, real_unshuffle = native_planes.frame, native_planes.Frame.unshuffle

    def frame(*args):
        f = real_frame(*args)
        if f is None:
            seen.append(False)
        return f

    def unshuffle(self, out):
        seen.append(real_unshuffle(self, out))
        return seen[-1]
    monkeypatch.setattr(native_planes, "frame", frame)
    monkeypatch.setattr(native_planes.Frame, "unshuffle", unshuffle)
    return seen


@pytest.mark.parametrize("width", [2, 4, 8])
@pytest.mark.parametrize("n", [127, 128, 1000, 1 << 17])
def test_native_and_numpy_decode_agree(width, n, monkeypatch):
    """Real float bytes (raw mantissa planes, zstd exponent planes), around c-blosc's split threshold."""
    data = _weights(n * width // 4 + 1, n).view(np.uint8)[:n * width].copy()
    params, payload = bytegroup.encode_planes(data, width, 1)
    payload = bytes(payload)
    seen = _spy(monkeypatch)
    got = bytegroup.decode_planes(params, payload, len(data), what="t").tobytes()
    assert got == data.tobytes() == _numpy_decode(params, payload, len(data), monkeypatch)
    assert seen[:1] == [n >= 128 and width >= 4]   # short planes and two planes: numpy


def test_every_plane_mode_mix_decodes_natively(monkeypatch):
    """Planes raw or zstd in any order (delta planes are all zstd; keyframes mostly raw)."""
    n, w = 4096, 4
    rng = np.random.default_rng(0)
    planes = [rng.integers(0, 256, n, dtype=np.uint8), np.zeros(n, np.uint8),
              (np.arange(n) % 7).astype(np.uint8), rng.integers(0, 4, n, dtype=np.uint8)]
    data = np.stack(planes, axis=1).reshape(-1)
    params, payload = bytegroup.encode_planes(data, w, 1)
    assert params["m"] == [0, 1, 1, 1]
    seen = _spy(monkeypatch)
    assert bytegroup.decode_planes(params, bytes(payload), len(data), what="t").tobytes() == data.tobytes()
    assert seen == [True]


def _frame_plane_payload(extra: bytes = b"", pad_to: int | None = None):
    """A 4-byte-wide chunk whose top plane is one zstd frame (plus ``extra`` bytes after it)."""
    n = 1024
    data = _weights(n, 5).view(np.uint8).copy()
    params, payload = bytegroup.encode_planes(data, 4, 1)
    assert params["m"] == [0, 0, 0, 1]
    frame = bytes(payload)[3 * n:] + extra
    if pad_to is not None:   # a frame exactly n bytes long: a skippable frame fills the rest
        gap = pad_to - len(frame)
        assert gap >= 8
        frame += (0x184D2A50).to_bytes(4, "little") + (gap - 8).to_bytes(4, "little") + bytes(gap - 8)
    params = {"w": 4, "m": [0, 0, 0, 1], "s": [n, n, n, len(frame)]}
    return data, params, bytes(payload)[:3 * n] + frame


def test_bytes_after_a_frame_are_ignored_as_the_spec_says(monkeypatch):
    """The zstd planes are decompressed by the spec's decode before c-blosc sees any plane."""
    data, params, payload = _frame_plane_payload(b"tail")
    seen = _spy(monkeypatch)
    assert bytegroup.decode_planes(params, payload, len(data), what="t").tobytes() == data.tobytes()
    assert seen == [True]


def test_a_zstd_plane_as_long_as_a_raw_one_is_decompressed(monkeypatch):
    """A zstd plane of exactly n bytes (legal, though deltackpt never writes one) is a frame, not
    raw bytes: c-blosc only ever sees decompressed planes."""
    data, params, payload = _frame_plane_payload(pad_to=1024)
    seen = _spy(monkeypatch)
    assert bytegroup.decode_planes(params, payload, len(data), what="t").tobytes() == data.tobytes()
    assert seen == [True]


def test_frames_declaring_the_wrong_size_are_refused_before_the_native_call(monkeypatch):
    data, params, payload = _frame_plane_payload()
    other = _weights(2048, 6).view(np.uint8)
    other_params, other_payload = bytegroup.encode_planes(other, 4, 1)
    frame = bytes(other_payload)[3 * 2048:]   # declares 2048 bytes where 1024 belong
    seen = _spy(monkeypatch)
    with pytest.raises(CorruptObjectError, match="declares 2048 bytes, expected 1024"):
        bytegroup.decode_planes({"w": 4, "m": [0, 0, 0, 1], "s": [1024] * 3 + [len(frame)]},
                                payload[:3 * 1024] + frame, len(data), what="t")
    assert seen == []


def test_a_damaged_frame_is_refused_before_the_native_call(monkeypatch):
    data, params, payload = _frame_plane_payload()
    damaged = bytearray(payload)
    damaged[3 * 1024 + 12] ^= 0xFF   # inside the compressed block
    seen = _spy(monkeypatch)
    try:
        out = bytegroup.decode_planes(params, bytes(damaged), len(data), what="t").tobytes()
    except CorruptObjectError:
        assert seen == []
        return
    assert out != data.tobytes()   # zstd may decode damage to other bytes: the chunk hash's job


@pytest.mark.parametrize("width", [4, 5, 8, 16])
@pytest.mark.parametrize("n", [128, 129, 4096, 16385, 3 * 16384 + 77, 1 << 19])
def test_every_width_and_plane_length_interleaves_exactly(width, n):
    """Plane lengths that are and are not multiples of c-blosc's SIMD widths, up to a 2 MiB chunk
    of float32 (the frame is one block, never split)."""
    rng = np.random.default_rng(width * n)
    data = rng.integers(0, 256, width * n, dtype=np.uint8)
    planes = [np.ascontiguousarray(data.reshape(n, width)[:, k]) for k in range(width)]
    out = np.zeros_like(data)
    assert native_planes.interleave(planes, out)
    assert out.tobytes() == data.tobytes()


def test_what_c_blosc_cannot_take_is_left_to_numpy():
    planes = [np.zeros(127, np.uint8)] * 4
    assert native_planes.interleave(planes, np.zeros(4 * 127, np.uint8)) is False     # too short to split
    assert native_planes.interleave([np.zeros(256, np.uint8)] * 2, np.zeros(512, np.uint8)) is False  # numpy as fast
    assert native_planes.interleave([np.zeros(256, np.uint8)] * 17, np.zeros(17 * 256, np.uint8)) is False
    out = np.zeros(4 * 1024, np.uint8)
    out.flags.writeable = False
    assert native_planes.interleave([np.ones(1024, np.uint8)] * 4, out) is False
    assert not out.any()


def test_without_blosc_the_numpy_path_decodes_everything(monkeypatch):
    data = _weights(1 << 16, 2).view(np.uint8).copy()
    params, payload = bytegroup.encode_planes(data, 4, 1)
    assert _numpy_decode(params, bytes(payload), len(data), monkeypatch) == data.tobytes()


def _room_for(payload: bytes, raw_len: int, head: int = 32, tail: int = 128):
    """The payload in a room as the reader lays it out: ``head`` bytes before it, and after it as
    many bytes as it decodes to beyond its length plus ``tail``."""
    from deltackpt.codecs.base import Room
    size = head + len(payload) + max(0, raw_len - len(payload)) + tail
    buf = bytearray(b"\xa5" * size)
    buf[head:head + len(payload)] = payload
    return Room(memoryview(buf), head, len(payload), 0, size), buf


PLANE_ORDERS = ["raw-first", "zstd-first", "all-raw", "all-zstd"]


def mixed_planes(order: str) -> tuple[np.ndarray, dict, bytes]:
    """A 4-byte-wide chunk whose planes are stored raw or zstd in the ``order`` named (noise does
    not compress, a short cycle does): (data, params, payload)."""
    n, w = 4096, 4
    rng = np.random.default_rng(1)
    noise, flat = rng.integers(0, 256, n, dtype=np.uint8), (np.arange(n) % 3).astype(np.uint8)
    planes = {"raw-first": [noise, noise[::-1].copy(), noise ^ 7, flat],
              "zstd-first": [flat, noise, flat[::-1].copy(), noise ^ 9],
              "all-raw": [noise, noise ^ 1, noise ^ 2, noise ^ 3],
              "all-zstd": [flat, flat ^ 1, flat ^ 2, flat ^ 3]}[order]
    data = np.stack(planes, axis=1).reshape(-1)
    params, payload = bytegroup.encode_planes(data, w, 1)
    return data, params, bytes(payload)


@pytest.mark.parametrize("order", PLANE_ORDERS)
def test_a_payload_decodes_in_its_room_to_the_same_bytes(order):
    """decode_planes_in_room builds the c-blosc frame where the payload lies (raw planes moving
    forward when zstd planes come first) and gives exactly decode_planes' bytes."""
    data, params, payload = mixed_planes(order)
    room, _buf = _room_for(payload, len(data))
    out = np.zeros(len(data), np.uint8)
    assert bytegroup.decode_planes_in_room(params, room, out, what="t")
    assert out.tobytes() == data.tobytes() == bytegroup.decode_planes(params, payload, len(data), what="t").tobytes()


def test_a_room_too_small_or_a_chunk_for_numpy_is_left_untouched():
    """False, with the room and the destination as they were, when the frame would not fit or the
    chunk is not c-blosc's (two planes): the caller decodes the payload the ordinary way."""
    data = _weights(4096, 3).view(np.uint8).copy()
    params, payload = bytegroup.encode_planes(data, 4, 1)
    payload = bytes(payload)
    from dataclasses import replace
    for head, short in ((8, 0), (32, 1)):   # no room for the frame's header; one byte short at the end
        room, buf = _room_for(payload, len(data), head=head, tail=0)
        room = replace(room, hi=room.hi - short)
        before, out = bytes(buf), np.zeros(len(data), np.uint8)
        assert not bytegroup.decode_planes_in_room(params, room, out, what="t")
        assert bytes(buf) == before and not out.any()
    halves = np.random.default_rng(2).integers(0, 256, 8192, dtype=np.uint8)
    params2, payload2 = bytegroup.encode_planes(halves, 2, 1)
    room, buf = _room_for(bytes(payload2), len(halves))
    before = bytes(buf)
    assert not bytegroup.decode_planes_in_room(params2, room, np.zeros(len(halves), np.uint8), what="t")
    assert bytes(buf) == before


def test_a_damaged_zstd_plane_in_a_room_is_refused_typed():
    data = _weights(4096, 4).view(np.uint8).copy()
    params, payload = bytegroup.encode_planes(data, 4, 1)
    assert params["m"] == [0, 0, 0, 1]
    damaged = bytearray(payload)
    damaged[3 * 4096 + 4] ^= 0xFF   # the frame header's content size
    room, _buf = _room_for(bytes(damaged), len(data))
    with pytest.raises(CorruptObjectError):
        bytegroup.decode_planes_in_room(params, room, np.zeros(len(data), np.uint8), what="t")

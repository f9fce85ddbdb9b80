"""Byte planes to elements and back in native code: the package's own loops, else c-blosc's.

**The package's loops** (``_planes.c``, compiled at install when a C compiler is there) take each
plane where it lies (:func:`interleave_from`): a raw plane in the bytes read from the pack (the
page cache's own, for a warm read), a zstd plane decompressed into this thread's work buffer, and
write the elements straight into the destination in one pass.  Nothing is framed or copied first:
on a 2 MiB float32 chunk 0.17 ms against c-blosc's 0.32 ms, which copies its frame into a block
buffer before unshuffling.  A save's grouping goes through them too (:func:`group_from`: 0.19 ms
against numpy's four shifts, 0.55 ms).

**c-blosc**, where the loops were not built: numpy needs seven passes over a chunk to interleave
four byte planes (widen, shift, or); c-blosc's unshuffle does it in one, near memcpy speed
(bench/DELTAS.md, "Speed"). python-blosc offers it only inside its decoder, so the planes are framed
as a c-blosc 1.x chunk (c-blosc's README_CHUNK_FORMAT.rst, format version 2) of one block that is
not split into streams (flag 0x10): that block's one stream, stored raw, is the byte-shuffled block,
which is exactly the planes back to back. So a decoder writes each plane straight into its place in
the frame (a raw plane copied from the payload, a zstd plane decompressed there, by
:func:`bytegroup.zstd_decompress_into` with the spec's checks) and c-blosc, in C with the GIL
released, copies the stream to its block buffer and unshuffles it into the destination; c-blosc
decompresses nothing.

The on-disk bytes do not change: the frame is a per-thread buffer reused from chunk to chunk.  The
one block costs c-blosc a block-sized buffer for the call (a 2 MiB chunk: 2 MiB); the earlier
framing in 16 KiB-per-plane blocks kept that at two small blocks but had to copy every plane
segment by segment with a 4-byte size in front of each, which cost more than the unshuffle itself
(a 2 MiB float32 chunk: 282 -> 110 us for framing and unshuffle, 45 us being a memcpy of it).
The numpy path stays for two planes (as fast there) and for what c-blosc cannot take: blosc not
installed, more than 16 planes, planes shorter than 128 bytes (numpy is as fast there), a
destination numpy cannot write to, and any error c-blosc reports.  The reader hash-checks every
decoded chunk either way.
"""

from __future__ import annotations

import functools
import struct
from types import ModuleType

import numpy as np

from .buffers import buffer

_planes: ModuleType | None
try:
    from . import _planes   # the compiled loops (_planes.c), built at install
except ImportError:   # no C compiler where the package was installed: c-blosc, else numpy
    _planes = None


@functools.cache
def _c_blosc() -> ModuleType | None:
    """python-blosc, imported at first need: only where the compiled loops are missing does a
    decode call it, and importing it costs a fresh process ~9 ms (it imports its own tests, and
    psutil with them).  None where it is not installed: the numpy path decodes the same bytes."""
    try:
        import blosc
    except ImportError:
        return None
    # a call with more than one c-blosc thread starts a thread pool; the read path runs chunks on
    # its own threads, so each call must release the GIL.  Both are python-blosc's process-wide settings.
    blosc.set_nthreads(1)
    blosc.set_releasegil(True)
    return blosc


_HEADER = struct.Struct("<BBBBIII")    # version, versionlz, flags, typesize, nbytes, blocksize, cbytes
_FLAGS = 0x01 | 0x10                   # byte shuffle, blocks not split (blosclz, never called: the stream is raw)
_BODY = _HEADER.size + 4 + 4           # header, the one block's start, its one stream's size
_MIN_PLANE = 128                       # shorter planes: numpy costs no more than the framing
# two planes (bfloat16, float16) numpy interleaves in three cheap passes, as fast as framing them
# for c-blosc (bfloat16 states decoded 0.8-0.9x as fast through c-blosc, bench/DELTAS.md "Speed")
_MIN_WIDTH = 4
_MAX_BYTES = 0x7FFF0000 - _BODY        # c-blosc's sizes are signed 32-bit


def available() -> bool:
    """Whether python-blosc is installed (the native path can run at all)."""
    return _c_blosc() is not None


def compiled() -> bool:
    """Whether the package's own loops (``_planes.c``) were built: then planes go straight from
    where they lie to the destination (:func:`interleave_from`) and a save groups them in one pass
    (:func:`group_from`), and c-blosc's frame is not used."""
    return _planes is not None


def interleave_from(planes: "list[np.ndarray | memoryview]", out: np.ndarray) -> bool:
    """``out[i * w + k] = planes[k][i]`` in one pass, each plane read where it lies (a raw plane
    in the span buffer the pack was read into, a decompressed one in a work buffer); False
    (``out`` untouched) without the compiled loops."""
    if _planes is None:
        return False
    _planes.interleave(out, planes)
    return True


def group_from(data: np.ndarray, width: int, planes: np.ndarray) -> bool:
    """Byte ``k`` of every ``width``-byte element of ``data`` into row ``k`` of the (width, n)
    array ``planes``, in one pass; False (nothing written) without the compiled loops or for a
    layout they do not take."""
    if _planes is None or not planes.flags.c_contiguous or not data.flags.c_contiguous:
        return False
    _planes.group(data, planes.reshape(-1), width)
    return True


def takes(width: int, n: int, out: np.ndarray) -> bool:
    """Whether ``width`` planes of ``n`` bytes into ``out`` go the native way (:func:`frame`'s test)."""
    return not (_c_blosc() is None or not _MIN_WIDTH <= width <= 16 or n < _MIN_PLANE or len(out) != width * n
                or not out.flags.writeable or not out.flags.c_contiguous or len(out) > _MAX_BYTES)


class Frame:
    """This thread's c-blosc chunk for ``width`` planes of ``n`` bytes: fill :attr:`planes` (a
    (width, n) uint8 view inside it), then :meth:`unshuffle` into the destination.  Valid until
    this thread asks for another frame."""

    HEAD = _BODY   # bytes of c-blosc header in front of the planes

    def __init__(self, width: int, n: int, where: np.ndarray | None = None) -> None:
        """``where``: a uint8 array of ``HEAD + width * n`` bytes to build the frame in (its planes
        may already be in place, after the header), instead of this thread's buffer."""
        nbytes = width * n
        self._chunk = buffer("blosc", _BODY + nbytes) if where is None else where
        _HEADER.pack_into(self._chunk.data, 0, 2, 1, _FLAGS, width, nbytes, nbytes, _BODY + nbytes)
        struct.pack_into("<ii", self._chunk.data, _HEADER.size, _HEADER.size + 4, nbytes)
        self.planes = self._chunk[_BODY:_BODY + nbytes].reshape(width, n)

    def unshuffle(self, out: np.ndarray) -> bool:
        """Interleave the planes into ``out``; False (``out`` may be partly written) when c-blosc
        refuses, for the numpy path to write it all again."""
        try:
            return _c_blosc().decompress_ptr(self._chunk, out.ctypes.data) == len(out)  # type: ignore[union-attr]  # frame() made it: installed
        except Exception:  # noqa: BLE001 - any refusal: the numpy path decodes instead
            return False


def frame(width: int, n: int, out: np.ndarray) -> Frame | None:
    """A frame for ``width`` planes of ``n`` bytes to be interleaved into ``out``, or None when
    this case belongs to the numpy path."""
    if (_c_blosc() is None or not _MIN_WIDTH <= width <= 16 or n < _MIN_PLANE or len(out) != width * n
            or not out.flags.writeable or not out.flags.c_contiguous or len(out) > _MAX_BYTES):
        return None   # the same test as takes(), inline: one Python call fewer per chunk
    return Frame(width, n)


def interleave(planes: list[np.ndarray], out: np.ndarray) -> bool:
    """Write ``planes`` (``w`` uint8 arrays of ``n`` bytes) into ``out`` as ``n`` elements of ``w``
    bytes, in native code; False (``out`` untouched) when this case belongs to the numpy path."""
    width = len(planes)
    f = frame(width, len(out) // width if width else 0, out)
    if f is None:
        return False
    for k, plane in enumerate(planes):
        f.planes[k] = plane
    return f.unshuffle(out)

"""Other libraries' typed-array codecs on the chunks of bench/codec_speed.py: ratio and single-thread
encode / decode MB/s, decoding into a preallocated destination wherever the library can.

A delta item is XORed with its base first (the same for every row, not timed), so the rows compare
the shuffle + entropy stage that keyframes and XOR deltas share.  Libraries that are not installed
are skipped with a note; none of them is a dependency of deltackpt (see bench/DELTAS.md, "Speed").
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import zstandard

from deltackpt.codecs.bytegroup import decode_planes, encode_planes, width_for


def _inputs(items: list) -> list[tuple[bytes, int]]:
    out = []
    for raw, ctx, base in items:
        data = raw if base is None else (np.frombuffer(raw, np.uint8) ^ np.frombuffer(base, np.uint8)).tobytes()
        out.append((data, width_for(ctx.itemsize, len(raw))))
    return out


def _today() -> tuple[Callable, Callable]:
    def enc(data: bytes, w: int) -> Any:
        params, payload = encode_planes(data, w, 1)
        return params, bytes(payload)

    def dec(blob: Any, out: np.ndarray) -> None:
        decode_planes(blob[0], blob[1], len(out), what="bench", out=out)
    return enc, dec


def _zstd_planes(level: int) -> tuple[Callable, Callable]:
    """Every plane one zstd frame at ``level`` (no sample, no raw planes); decoded with readinto."""
    cctx, dctx = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()

    def enc(data: bytes, w: int) -> Any:
        arr = np.frombuffer(data, np.uint8)
        return w, [cctx.compress(arr[k::w].tobytes()) for k in range(w)]

    def dec(blob: Any, out: np.ndarray) -> None:
        w, frames = blob
        rows = out.reshape(-1, w)
        plane = np.empty(len(rows), np.uint8)
        for k, f in enumerate(frames):
            dctx.stream_reader(f).readinto(plane)
            rows[:, k] = plane
    return enc, dec


def _blosc2(filt: str, clevel: int, split: str, blocksize: int) -> tuple[Callable, Callable]:
    import blosc2
    kw = dict(clevel=clevel, codec=blosc2.Codec.ZSTD, filters=[getattr(blosc2.Filter, filt)],
              splitmode=getattr(blosc2.SplitMode, split), nthreads=1, blocksize=blocksize)

    def enc(data: bytes, w: int) -> Any:
        return blosc2.compress2(data, typesize=w, **kw)

    def dec(blob: Any, out: np.ndarray) -> None:
        blosc2.decompress2(blob, dst=out)
    return enc, dec


def _blosc1(shuffle: str, clevel: int, cname: str) -> tuple[Callable, Callable]:
    import blosc
    blosc.set_nthreads(1)
    blosc.set_releasegil(True)
    mode = getattr(blosc, shuffle)

    def enc(data: bytes, w: int) -> Any:
        return blosc.compress(data, typesize=w, clevel=clevel, shuffle=mode, cname=cname)

    def dec(blob: Any, out: np.ndarray) -> None:
        blosc.decompress_ptr(blob, out.ctypes.data)
    return enc, dec


def _numcodecs(level: int) -> tuple[Callable, Callable]:
    from numcodecs import Shuffle, Zstd
    z = Zstd(level=level)

    def enc(data: bytes, w: int) -> Any:
        return w, z.encode(Shuffle(w).encode(np.frombuffer(data, np.uint8)))

    def dec(blob: Any, out: np.ndarray) -> None:
        w, frame = blob
        tmp = np.empty(len(out), np.uint8)
        z.decode(frame, out=tmp)
        Shuffle(w).decode(tmp, out=out)
    return enc, dec


def _rows() -> dict[str, Callable[[], tuple[Callable, Callable]]]:
    rows: dict[str, Callable[[], tuple[Callable, Callable]]] = {
        "numpy + python-zstandard, bg-zstd planes (today's bytes)": _today,
        "python-zstandard, every plane level 1": lambda: _zstd_planes(1),
        "python-zstandard, every plane level 3": lambda: _zstd_planes(3),
        "numcodecs Shuffle + Zstd(1)": lambda: _numcodecs(1),
        "numcodecs Shuffle + Zstd(3)": lambda: _numcodecs(3),
    }
    for shuffle in ("SHUFFLE", "BITSHUFFLE"):
        for clevel in (1, 3):
            rows[f"python-blosc (c-blosc 1) {shuffle} zstd clevel {clevel}"] = (
                lambda *a: lambda: _blosc1(*a))(shuffle, clevel, "zstd")
    rows["python-blosc (c-blosc 1) SHUFFLE lz4 clevel 5"] = lambda: _blosc1("SHUFFLE", 5, "lz4")
    for filt in ("SHUFFLE", "BITSHUFFLE"):
        for clevel in (1, 3):
            for split, bs in (("ALWAYS_SPLIT", 0), ("AUTO_SPLIT", 0), ("ALWAYS_SPLIT", 2 << 20)):
                name = f"blosc2 {filt} zstd clevel {clevel} {split} blocksize {bs or 'auto'}"
                rows[name] = (lambda *a: lambda: _blosc2(*a))(filt, clevel, split, bs)
    return rows


def alternatives(items: list, rounds: int) -> dict[str, Any]:
    """Ratio, encode and decode MB/s per alternative (best of ``rounds`` passes, interleaved)."""
    data = _inputs(items)
    raw = sum(len(d) for d, _ in data)
    out = np.empty(max(len(d) for d, _ in data), np.uint8)
    live, res = {}, {}
    for name, make in _rows().items():
        try:
            enc, dec = make()
        except ImportError as exc:
            res[name] = {"skipped": f"not installed ({exc.name})"}
            continue
        blobs = [enc(d, w) for d, w in data]
        for (d, _), b in zip(data, blobs):
            dec(b, out[:len(d)])
            assert out[:len(d)].tobytes() == d, name
        size = sum(_size(b) for b in blobs)
        live[name] = (enc, dec, blobs, size, [], [])
    for _ in range(rounds):
        for enc, dec, blobs, _, es, ds in live.values():
            t = time.perf_counter()
            for d, w in data:
                enc(d, w)
            es.append(time.perf_counter() - t)
            t = time.perf_counter()
            for (d, _), b in zip(data, blobs):
                dec(b, out[:len(d)])
            ds.append(time.perf_counter() - t)
    for name, (_, _, _, size, es, ds) in live.items():
        res[name] = {"ratio": size / raw, "encode MB/s": raw / min(es) / 1e6, "decode MB/s": raw / min(ds) / 1e6}
    return res


def _size(blob: Any) -> int:
    if isinstance(blob, (bytes, bytearray)):
        return len(blob)
    if isinstance(blob[1], list):
        return sum(len(f) for f in blob[1])
    return len(blob[1]) + (0 if isinstance(blob[0], int) else 8 * len(blob[0].get("s", ())))

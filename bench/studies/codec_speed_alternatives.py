"""Other libraries' typed-array codecs on the chunks of the codec_speed study: ratio and single-thread
encode / decode MB/s, decoding into a preallocated destination wherever the library can.

A delta item is XORed with its base first (the same for every row, not timed), so the rows compare
the shuffle + entropy stage that keyframes and XOR deltas share.  Libraries that are not installed
are skipped with a note; none of them is a dependency of deltackpt (see bench/DELTAS.md, "Speed").
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import zstandard

from bench.common.timing import best_sums
from deltackpt.codecs.bytegroup import decode_planes, encode_planes, width_for


def _inputs(items: list) -> list[tuple[bytes, int]]:
    out = []
    for raw, ctx, base in items:
        data = raw if base is None else (np.frombuffer(raw, np.uint8) ^ np.frombuffer(base, np.uint8)).tobytes()
        out.append((data, width_for(ctx.itemsize, len(raw))))
    return out


def _today() -> tuple[Callable, Callable]:
    """deltackpt's plane layout, decoded by the library's own decoder (c-blosc where installed)."""
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
        "deltackpt planes, the library's decoder": _today,
        "python-zstandard, every plane level 1": lambda: _zstd_planes(1),
        "numcodecs Shuffle + Zstd(1)": lambda: _numcodecs(1),
        "python-blosc (c-blosc 1) SHUFFLE zstd clevel 1": lambda: _blosc1("SHUFFLE", 1, "zstd"),
        "python-blosc (c-blosc 1) BITSHUFFLE zstd clevel 1": lambda: _blosc1("BITSHUFFLE", 1, "zstd"),
        "python-blosc (c-blosc 1) SHUFFLE lz4 clevel 5": lambda: _blosc1("SHUFFLE", 5, "lz4"),
    }
    # blosc2: its own framing; ALWAYS_SPLIT gives one zstd stream per byte plane, as deltackpt's planes
    for filt, clevel, bs in (("SHUFFLE", 1, 0), ("SHUFFLE", 1, 2 << 20), ("SHUFFLE", 3, 0), ("BITSHUFFLE", 1, 0)):
        name = f"blosc2 {filt} zstd clevel {clevel} ALWAYS_SPLIT blocksize {bs or 'auto'}"
        rows[name] = (lambda *a: lambda: _blosc2(*a))(filt, clevel, "ALWAYS_SPLIT", bs)
    return rows


def alternatives(items: list, rounds: int, most: int = 48) -> dict[str, Any]:
    """Ratio, encode and decode MB/s per alternative (best of ``rounds`` passes, interleaved), on
    at most ``most`` of the items, evenly spread."""
    data = _inputs(items[::max(1, len(items) // most)][:most])
    if not data:
        return {}
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
    enc_s = best_sums({k: [(lambda e=enc, d=d, w=w: e(d, w)) for d, w in data]
                       for k, (enc, _, _, _, _, _) in live.items()}, rounds)
    dec_s = best_sums({k: [(lambda f=dec, b=b, n=len(d): f(b, out[:n])) for (d, _), b in zip(data, blobs)]
                       for k, (_, dec, blobs, _, _, _) in live.items()}, rounds)
    for k, v in live.items():
        v[4].append(enc_s[k])
        v[5].append(dec_s[k])
    for name, (_, _, _, size, es, ds) in live.items():
        res[name] = {"ratio": size / raw, "encode MB/s": raw / min(es) / 1e6, "decode MB/s": raw / min(ds) / 1e6}
    return res


def _size(blob: Any) -> int:
    if isinstance(blob, (bytes, bytearray)):
        return len(blob)
    if isinstance(blob[1], list):
        return sum(len(f) for f in blob[1])
    return len(blob[1]) + (0 if isinstance(blob[0], int) else 8 * len(blob[0].get("s", ())))

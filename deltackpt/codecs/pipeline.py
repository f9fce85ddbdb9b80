"""Choosing an encoding per chunk.

Lossless: the keyframe codec (byte-grouped zstd) or, when a base chunk is at hand and the chain
is shorter than the keyframe interval, XOR delta, integer (zigzag) delta, integer delta against
a scaled base (decaying Adam moments) or sparse rows.  The
dense candidates are compared on a sample of the chunk and only the winner encodes it all;
whatever wins is stored raw if it is not smaller than the raw bytes.

Lossy (only when asked): q8/q4 block-quantized delta against the decoded base (plain, or scaled
by a fitted decay factor: whichever is smaller), or a cast to fp16/bf16.  Chunks a lossy codec
cannot take (non-finite values, non-float dtypes, no base) fall back to lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CodecError
from .base import ChunkContext, Encoded
from .registry import (BG_ZSTD, CAST_BF16, CAST_FP16, Q4_DELTA, Q4_SCALED_DELTA, Q8_DELTA, Q8_SCALED_DELTA, RAW,
                       SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA, get)

MODES = ("lossless", "q8-delta", "q4-delta", "fp16", "bf16")
# a mode tries its codecs in order and keeps the smallest payload (the first on a tie): the scaled
# variant wins on decaying optimizer moments; the plain one still wins some weight chunks, where
# its finer step costs nothing (minilm-full q8 everything: 0.088 with both, 0.090 scaled only)
_LOSSY = {"q8-delta": (Q8_SCALED_DELTA, Q8_DELTA), "q4-delta": (Q4_SCALED_DELTA, Q4_DELTA),
          "fp16": (CAST_FP16,), "bf16": (CAST_BF16,)}
_SAMPLE = 64 * 1024
#: the bytes a probe compares (:func:`probe_slice`'s default), for a writer keeping a chunk's sample
PROBE_SAMPLE = _SAMPLE
#: chunks shorter than this are not sampled (sample_delta_fraction says None)
SAMPLE_MIN = 4096


@dataclass(frozen=True)
class BaseChunk:
    """The decoded bytes of the chunk at the same place in the parent version."""

    chunk_id: bytes
    data: bytes | memoryview
    depth: int
    stored_bytes: int = 0  # its stored object's size (0: unknown); a keyframe's tells when a delta has outgrown it


@dataclass(frozen=True)
class ChunkEncoding:
    encoding: int
    encoded: Encoded
    base: BaseChunk | None

    @property
    def depth(self) -> int:
        return 0 if self.base is None else self.base.depth + 1

    @property
    def lossless(self) -> bool:
        return self.encoded.recon is None


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise CodecError(f"unknown encoding mode {mode!r}; choose one of {MODES}")
    return mode


def encode_chunk(raw: bytes | memoryview, ctx: ChunkContext, *, mode: str = "lossless", base: BaseChunk | None = None,
                 keyframe_interval: int = 8, candidates: tuple[int, ...] | None = None,
                 prefer: int | None = None) -> ChunkEncoding:
    """Encode one chunk.  ``candidates`` restricts the lossless codecs tried (benchmarks use it).

    ``prefer``: the delta codec that won at this chunk's position last time.  With a base at hand
    it is the only codec tried (no sampling, and no sparse attempt when it is a dense one): sampling
    four codecs cost a third of a delta save's CPU on minilm-full, and the winner at a position
    rarely changes within a chain.  Sparse rows are costly to rule out where up to half the rows
    changed (the Adam moments of an embedding table: a full XOR, row test and gather), and a dense
    delta compresses unchanged rows to almost nothing anyway.  The caller samples afresh after
    each keyframe by not passing it.  When the base is a keyframe whose ``stored_bytes`` the
    preferred delta does not undercut, the others are sampled again (a fresh keyframe included).

    Example::

        choice = encode_chunk(raw, ChunkContext("float32", 4, 0, 1), base=BaseChunk(cid, old, 0))
        choice.encoding, len(choice.encoded.payload)
    """
    if base is not None and (len(base.data) != len(raw) or base.depth + 1 > keyframe_interval):
        base = None
    if mode != "lossless":
        lossy = _encode_lossy(raw, ctx, mode, base)
        if lossy is not None:
            return lossy
    allowed = candidates or (BG_ZSTD, XOR_DELTA, SUB_DELTA, SCALED_DELTA, SPARSE)
    best: ChunkEncoding | None = None
    dense = [c for c in allowed if c != SPARSE and (base is not None or not get(c).needs_base)]
    if base is not None and prefer in dense and get(prefer).needs_base:
        enc = get(prefer).encode(raw, ctx, base.data)
        if enc is not None:
            best = ChunkEncoding(prefer, enc, base)
            # a delta no smaller than the keyframe it is taken against (a star delta far from its
            # keyframe) may now lose to the others, a fresh keyframe included: they are sampled again
            outgrown = base.depth == 0 and len(enc.payload) >= base.stored_bytes > 0
            dense = [c for c in dense if c != prefer] if outgrown else []
    if best is None and base is not None and SPARSE in allowed:
        enc = get(SPARSE).encode(raw, ctx, base.data)
        if enc is not None:
            best = ChunkEncoding(SPARSE, enc, base)
    if len(dense) > 1:
        dense = _sample_winner(raw, ctx, base, dense)
    for c in dense:
        codec = get(c)
        enc = codec.encode(raw, ctx, base.data if codec.needs_base and base is not None else None)
        if enc is not None and (best is None or len(enc.payload) < len(best.encoded.payload)):
            best = ChunkEncoding(c, enc, base if codec.needs_base else None)
    if best is None or len(best.encoded.payload) >= len(raw):
        stored = get(RAW).encode(raw, ctx)
        assert stored is not None   # raw takes every chunk
        return ChunkEncoding(RAW, stored, None)
    return best


def _encode_lossy(raw: bytes | memoryview, ctx: ChunkContext, mode: str, base: BaseChunk | None) -> ChunkEncoding | None:
    """The smallest encoding among the lossy mode's codecs, or None when none takes the chunk."""
    lossy: ChunkEncoding | None = None
    for eid in _LOSSY[check_mode(mode)]:
        codec = get(eid)
        if codec.needs_base and base is None:
            continue
        enc = codec.encode(raw, ctx, base.data if codec.needs_base and base else None)
        if enc is not None and (lossy is None or len(enc.payload) < len(lossy.encoded.payload)):
            lossy = ChunkEncoding(eid, enc, base if codec.needs_base else None)
    return lossy


def probe_slice(n: int, ctx: ChunkContext, size: int = _SAMPLE) -> slice | None:
    """Where :func:`sample_delta_fraction` looks in a chunk of ``n`` bytes: ``size`` bytes (64 KiB)
    from its middle, or a quarter of a smaller chunk, on row boundaries; None for a chunk under
    ``SAMPLE_MIN``."""
    return None if n < SAMPLE_MIN else _middle(n, ctx, size)


def _middle(n: int, ctx: ChunkContext, size: int) -> slice:
    align = max(ctx.row_bytes if ctx.row_bytes and ctx.row_bytes <= size else 1, 16)
    start = (n // 2 // align) * align
    if n > 2 * size:
        return slice(start, start + (size // align) * align)
    return slice(start, min(n, start + max(align, (n // 4 // align) * align)))


def sample_delta_fraction(raw: bytes | memoryview, ctx: ChunkContext, base: BaseChunk | None, prefer: int | None = None,
                          *, base_sample: bytes | None = None, size: int = _SAMPLE, sparse: bool = False) -> float | None:
    """About how large a delta of ``raw`` against ``base`` is, as a fraction of ``len(raw)``,
    judged on a sample (:func:`probe_slice` of ``size``) with the dense codec that won here last time, else
    xor-delta; None for a chunk too small to sample (under 4 KiB).  Cheap enough to ask before
    every delta encode of a position whose last change was dense; a sparse change comes out small
    (unchanged rows XOR to zeros).  ``base_sample``: the base's bytes at that slice, kept from an
    earlier save, in place of ``base`` (whose bytes then need not be at hand).  ``sparse``: judge
    a sparse-rows delta instead (1.0 when more of the sample's rows changed than one takes)."""
    s = probe_slice(len(raw), ctx, size)
    if s is None:
        return None
    if base_sample is not None:
        old: bytes | memoryview = base_sample
    else:
        assert base is not None
        old = base.data[s]
    if len(old) != s.stop - s.start:
        return None
    if sparse:
        enc = get(SPARSE).encode(raw[s], ctx, old)
        return 1.0 if enc is None else len(enc.payload) / (s.stop - s.start)
    codec = get(prefer if prefer in (XOR_DELTA, SUB_DELTA, SCALED_DELTA) else XOR_DELTA)
    enc = codec.encode(raw[s], ctx, old)
    return 0.0 if enc is None else len(enc.payload) / (s.stop - s.start)


def _sample_winner(raw: bytes | memoryview, ctx: ChunkContext, base: BaseChunk | None, dense: list[int]) -> list[int]:
    """The dense codec whose payload is smallest on a sample of the chunk (none when none takes it):
    the middle 64 KiB, or the whole of a chunk up to twice that."""
    s = _middle(len(raw), ctx, _SAMPLE) if len(raw) > 2 * _SAMPLE else slice(0, len(raw))
    sizes = {}
    for c in dense:
        e = get(c).encode(raw[s], ctx, base.data[s] if get(c).needs_base and base is not None else None)
        if e is not None:
            sizes[c] = len(e.payload)
    return [min(sizes, key=sizes.__getitem__)] if sizes else []

"""What a save writes for a changed chunk of the newest version (``delta_base = "child"``, lossless).

The newest version is what ``resume`` reads after a crash, so it must stay one keyframe plus a
bounded amount of cheap delta per chunk; and a save must write no more than what changed.  Both
hold when each changed chunk is written once, in its cheapest form that keeps the bound:

* a **sparse-rows forward delta** against the position's previous chunk when at most half its rows
  changed and the deltas written at this position since its last keyframe, this one included, add
  up to at most ``HEAD_DELTA_BUDGET`` x that keyframe's stored size (and the chain stays within
  the keyframe interval): an embedding table's rows, a few changed elements;
* otherwise the chunk **whole** (a keyframe), which starts a new chain.

Only sparse rows (``HEAD_CODEC``), because of what reading the newest version costs.  A sparse
delta is applied to the rows it names; the dense deltas (xor, sub, scaled) entropy-decode the whole
chunk, so each link of theirs cost a restart about three keyframe decodes (MiniLM saved every 2
steps: 2.3 ms a 2 MiB link against 0.8 ms a keyframe), and chains of them made the newest version
load 1.6x ``torch.load`` where keyframes load 1.2x (bench/DELTAS.md, "Dense deltas at the head").
The bytes they saved are small next to the written budget (0.50 -> 0.62x ``torch.save`` per save
at a save every 2 steps; at every 20 steps a full fine-tune's change is dense anyway), and older
versions still become dense reverse deltas later (deltify.py), so storage does not change.

A dense change (a full fine-tune's weights and moments) is thus written once, whole, and the newest
version reads it as one object; a sparse one (an embedding table: a delta is ~5 % of a keyframe)
costs its delta.  A dense position is judged again at the next save on a 16 KiB sample the handle
kept (or, in a process without it, read back now and then): a change that was dense need not stay
so (the moments of a sparse optimizer fill up as rows are first touched).  Older versions become
reverse deltas later, off the save's path, and only while retention keeps them (deltify.py).  A
keyframe whose change was no delta away (a dense delta of it was above ``KEEP_WHOLE_ABOVE`` of it:
Adam's moments often are) will most likely stay whole there too: the packer puts such keyframes in
a pack of their own, so deltification drops the others' packs without copying them out.

Why a budget relative to the keyframe (bench/DELTAS.md, "The sparse knob", has the measurements): it bounds what
reading the newest version costs, (1 + budget) x a keyframe per chunk, whatever the workload, and
it is what decides between paying bytes at every save and paying them at restore.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...codecs.base import ChunkContext
from ...codecs.pipeline import PROBE_SAMPLE, BaseChunk, ChunkEncoding, encode_chunk, sample_delta_fraction
from ...codecs.registry import SCALED_DELTA, SPARSE, SUB_DELTA, XOR_DELTA, get

#: forward deltas since a position's keyframe may add up to this fraction of the keyframe's stored size
HEAD_DELTA_BUDGET = 0.5
#: the lossless deltas deltification re-stores older versions with
DELTA_CODECS = (XOR_DELTA, SUB_DELTA, SCALED_DELTA, SPARSE)
#: the forward delta a save writes at the head: applied row by row, not decoded whole (see above)
HEAD_CODEC = SPARSE
#: maintenance pays only where it pays back: deltification re-stores a copy when the stored bytes it
#: saves are at least PAYBACK x the bytes it writes, i.e. the delta is at most 1 / (1 + PAYBACK) of
#: the copy it replaces (bench/MAINTENANCE.md has the curve of stored bytes against bytes written
#: and CPU seconds, and why the default sits here)
PAYBACK = 1.0
#: deltification keeps a keyframe whole when its reverse delta would be above this fraction of it
KEEP_WHOLE_ABOVE = 1 / (1 + PAYBACK)
#: a writer without the sample of a dense position (a fresh handle, or a full delta cache) reads
#: the position's chunk back to judge it again at about one save in this many; and a keyframe
#: measures again, instead of taking the last keyframe's answers, at about one save in this many:
#: its byte planes' compression (ChunkMemo.planes) and, at a position still dense, whether a
#: change this dense leaves it whole (stays_whole on the dense delta's sample; ChunkMemo.lasting)
REJUDGE_EVERY = 8
#: bytes of a dense position a handle keeps to judge it again at the next save without reading it
#: back (an xor-delta trial on 16 KiB: ~0.05 ms; 11 MB and 0.03 s a save for a 1.4 GB state)
REJUDGE_SAMPLE = 16 * 1024
#: a chunk at least this long keeps the probe's sample (pipeline.PROBE_SAMPLE, 64 KiB) from the first
#: save this handle writes it in, so its first change is judged on that sample exactly as on the
#: chunk read back: a dense one (a full fine-tune's) is written whole without the previous version
#: read and decoded (GPT-2 + AdamW: 1.4 GB a repository's second save read), with the same choices.
#: The sample is at most 1/16 of the chunk (3% of a 2 MiB one), held until the next save; a
#: shorter chunk is read back once instead, so samples stay a small share of the delta cache
FIRST_SAMPLE_MIN = 16 * PROBE_SAMPLE


def delta_budget(anchor_bytes: int, chain_bytes: int, budget: float = HEAD_DELTA_BUDGET) -> int:
    """Stored bytes the next forward delta at a position may take (<= 0: write a keyframe)."""
    return int(budget * anchor_bytes) - chain_bytes if anchor_bytes > 0 else 0


@dataclass(frozen=True)
class HeadChoice:
    """What :func:`encode_changed` chose for a changed chunk."""

    encoding: ChunkEncoding
    dense: bool | None           # no head delta takes this change, even in a fresh chain (None: not judged)
    delta_fraction: float | None  # about how large a dense delta against the previous chunk was (x raw size), if sampled


def encode_changed(raw: bytes | memoryview, ctx: ChunkContext, base: BaseChunk | None, max_bytes: int, *, prefer: int | None = None,
                   probe: bool = False, overhead: int = 0) -> HeadChoice:
    """A sparse-rows forward delta of ``raw`` against ``base`` whose stored size (payload +
    ``overhead``) fits ``max_bytes``, else ``raw`` as a keyframe.  ``probe``: the last change at
    this position was not a delta (it did not fit, or it is unknown), so a 64 KiB sample is
    compared first and a dense change costs one keyframe encode, not a delta encode as well; the
    sample of a dense change is also measured as a dense delta (``prefer``'s codec, else xor), which
    tells deltification whether the keyframe will stay whole (:func:`stays_whole`)."""
    if base is None or max_bytes <= overhead or len(base.data) != len(raw):
        return HeadChoice(encode_chunk(raw, ctx), None, None)
    if probe:
        frac = sample_delta_fraction(raw, ctx, base, sparse=True)
        if not sample_fits(frac, len(raw), max_bytes, overhead):
            return keyframe_choice(raw, ctx, frac, sample_delta_fraction(raw, ctx, base, prefer), overhead)
    # the codec itself, not encode_chunk: where no delta applies, that would copy the chunk as a
    # raw object only to have it thrown away for the keyframe
    enc = get(HEAD_CODEC).encode(raw, ctx, base.data)
    if enc is not None and len(enc.payload) + overhead <= max_bytes:
        return HeadChoice(ChunkEncoding(HEAD_CODEC, enc, base), False, None)
    frac = 1.0 if enc is None else len(enc.payload) / max(len(raw), 1)
    return keyframe_choice(raw, ctx, frac, None, overhead)


def keyframe_choice(raw: bytes | memoryview, ctx: ChunkContext, sparse_fraction: float | None,
                    dense_fraction: float | None, overhead: int = 0) -> HeadChoice:
    """``raw`` as a keyframe, after a sparse delta about ``sparse_fraction`` x its size (1.0: too
    many rows changed; None: not judged) did not fit: dense when it would not fit a fresh chain either."""
    kf = encode_chunk(raw, ctx)
    dense = None if sparse_fraction is None else too_dense(sparse_fraction, len(raw), len(kf.encoded.payload) + overhead)
    return HeadChoice(kf, dense, dense_fraction)


def sample_fits(frac: float | None, raw_len: int, max_bytes: int, overhead: int = 0) -> bool:
    """Whether a delta a sample put at ``frac`` of the chunk may fit ``max_bytes`` (10% slack: a
    sample is an estimate, and a full encode that misses only costs the encode)."""
    return frac is not None and frac * raw_len <= 1.1 * (max_bytes - overhead)


def rejudge_due(chunk_id: bytes) -> bool:
    """Whether a writer without a dense position's sample reads its chunk back at this save to
    judge it again: for about one stored chunk in ``REJUDGE_EVERY``, chosen by its id, so the same
    positions in any process.  A change that was dense need not stay so (an optimizer moment that
    fills up as rows are first touched, a schedule that anneals)."""
    return chunk_id[-1] % REJUDGE_EVERY == 0


def too_dense(delta_fraction: float, raw_len: int, keyframe_bytes: int) -> bool:
    """Whether a change whose sparse delta is ``delta_fraction`` x the chunk is too large for any forward
    delta (above ``HEAD_DELTA_BUDGET`` x the keyframe it replaces, the budget of a chain just
    begun): such a position is written whole next time without reading its base (bases.py), unless
    it is judged again and found sparse (:data:`REJUDGE_SAMPLE`, :func:`rejudge_due`), and
    deltification does not try to re-store it."""
    return delta_fraction * raw_len > HEAD_DELTA_BUDGET * keyframe_bytes


def stays_whole(delta_fraction: float | None, raw_len: int, keyframe_bytes: int,
                keep_whole_above: float = KEEP_WHOLE_ABOVE) -> bool:
    """Whether a keyframe just written will most likely never be re-stored as a delta: the
    change that made it was a delta of at least ``keep_whole_above`` x its size (a change as
    dense as the last one leaves deltification the same choice).  Such keyframes go to a pack of
    their own, so that deltification drops the packs of the others without copying them."""
    return delta_fraction is not None and delta_fraction * raw_len > keep_whole_above * keyframe_bytes

"""Encodings 10 and 11: block-quantized deltas (int8 / int4) against a SCALED decoded base.

Adam's moments decay geometrically wherever a gradient is zero (see scaled_delta.py): between two
checkpoints of MiniLM ~70% of the word-embedding rows see no token, and there ``exp_avg`` is the
base times beta1**20 = 0.12.  q8/q4-delta quantize ``new - base`` and so pay full codes for those
elements; here the prediction is ``alpha * base`` (alpha fitted per chunk, 1 when nothing decays).

What is left of an untouched element is then alpha times its base's own quantization error, which
a plain peak/qmax step would re-code at full width, version after version.  So in a decaying chunk
the step is never finer than what quantizing the VALUES of the block would use (peak|new|/qmax):
such residue rounds to zero.  The error against the truth stays at most half a step of THIS
version (one step for an element the non-negativity repair moved), because the residual is taken
against the decoded base: nothing accumulates along a chain.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import CorruptObjectError
from .quantize import BLOCK, REL_STEP, QuantizedDelta
from .scaled_delta import fit_alpha

_SAMPLE_BLOCKS = 256  # whole blocks, so each sampled element can be compared with its block's peak
DECAY = 1e-2
"""A fitted alpha within DECAY of 1 is taken as 1 (see _decaying for what gets the coarser floor)."""
PEAK_FLOOR = 0.5
"""In a decaying chunk the step is at least PEAK_FLOOR * peak|new block| / qmax.  1 would round away
all of an untouched element's inherited error (minilm-full q4 everything: 0.039 of torch.save);
0.5 keeps it at half the error a fresh quantization of the values would have, for 0.043."""


class ScaledQuantizedDelta(QuantizedDelta):
    def __init__(self, encoding_id: int, bits: int) -> None:
        super().__init__(encoding_id, bits)
        self.name = f"q{bits}-scaled-delta"

    def _fit(self, new_f: np.ndarray, base_f: np.ndarray) -> dict[str, Any] | None:
        return {"a": self._fit_alpha(new_f, base_f)}

    def _predict(self, base_f: np.ndarray, params: dict[str, Any]) -> np.ndarray:
        # the base widened to float64, one multiply by alpha, one rounding to the working type:
        # the encoder and every decoder compute the same prediction bit for bit
        with np.errstate(over="ignore"):
            return (base_f.astype(np.float64) * params["a"]).astype(base_f.dtype)

    def _floor(self, v: np.ndarray, nonneg: bool, extra: dict[str, Any]) -> np.ndarray | None:
        # REL_STEP of the rms for every tensor (bf16 keeps 8 bits; q8/q4-delta spare second moments
        # this floor, but against a scaled base their untouched rows need it to round to zero)
        f = np.sqrt(np.mean(np.square(v.astype(np.float64)), axis=1)) * REL_STEP
        if _decaying(extra["a"], nonneg):
            f = np.maximum(f, PEAK_FLOOR * np.abs(v).max(axis=1) / self.qmax)
        return f.astype(np.float32)

    def _final_scales(self, scales: np.ndarray, q: np.ndarray) -> np.ndarray:
        # a block whose codes are all zero needs no scale: a run of zeros compresses, a float32 not
        dead = ~q.reshape(len(scales), -1).any(axis=1)
        return np.where(dead, np.float32(0), scales).astype(np.float32)

    def _check_extra(self, params: dict[str, Any]) -> None:
        a = params.get("a")
        if not isinstance(a, float) or not math.isfinite(a):
            raise CorruptObjectError(f"{self.name}: alpha is malformed")

    def _fit_alpha(self, new: np.ndarray, base: np.ndarray) -> float:
        """The decay factor most elements share, or 1.0, fitted on a sample of whole blocks.

        scaled-delta's fit_alpha buckets exact ratios to 4 decimals; against a DECODED lossy base
        the ratios carry the base's quantization error (up to ~7% of a block's peak for q4) and do
        not bucket.  The median ratio is robust to that noise and to the minority of elements that
        got a gradient; it is kept when its absolute residual beats 1 and fit_alpha's answer."""
        nb = len(new) // BLOCK
        if nb == 0:
            return 1.0
        pick = np.unique(np.linspace(0, nb - 1, min(nb, _SAMPLE_BLOCKS)).astype(np.int64))
        n = new[:nb * BLOCK].reshape(nb, BLOCK)[pick].astype(np.float64)
        b = base[:nb * BLOCK].reshape(nb, BLOCK)[pick].astype(np.float64)
        # ratios only where the base is at least a quarter of its block's peak: a decoded base is
        # off by up to half a step of the block, which swamps its small elements (and the
        # non-negativity repair lifts tiny second moments to about a step)
        ok = (n != 0) & (np.abs(b) >= 0.25 * np.abs(b).max(axis=1, keepdims=True)) & (b != 0)
        if ok.sum() < 64:
            return 1.0
        cands = [1.0, float(np.median(n[ok] / b[ok]))]
        exact = fit_alpha(new, base)
        if exact is not None:
            cands.append(exact)
        # judged by the residual itself, not by the codes: the step floor depends on alpha, and
        # a coarser floor must not make a poor prediction look cheap
        costs = [float(np.abs(n[ok] - b[ok] * a).sum()) for a in cands]
        best = cands[int(np.argmin(costs))]  # ties go to the earliest: 1.0
        # within DECAY of 1 the fitted ratio is the base's noise (or a weight decay too small to
        # matter), and a ratio that is slightly off only inflates every residual, hence the step
        if not (math.isfinite(best) and 0 < abs(best) < 1e6) or abs(best - 1.0) <= DECAY:
            return 1.0
        return best


def _decaying(alpha: float, nonneg: bool) -> bool:
    """Whether a chunk looks like an Adam moment, whose untouched elements get the value-relative
    step floor: a second moment (>= 0) shrunk by more than DECAY (beta2**k, k >= 11 steps between
    saves) or a signed tensor at least halved (beta1**k, k >= 7).  Weights never shrink like that
    between saves (weight decay is ~lr*wd per step), but a weight matrix that moved everywhere can
    show a median ratio of, say, 0.99: it keeps the fine REL_STEP floor."""
    return 0 < alpha < (1.0 - DECAY if nonneg else 0.5)


"""What deltification remembers between runs on one handle (kept in the write session, so the
step after each save does not redo what an earlier one found): the verdicts (periods too large,
packs waiting, positions that did not pay back), each version's positions, and the sizes of the
reverse deltas it measured.  Forgetting any of it only costs measuring again: what a run ends up
doing is what a handle that remembers nothing does (tests/repo/test_deltify_economics.py).

Example::

    memo = session.deltify_memo or DeltifyMemo()
    memo.keep_only(candidates, ledger.size)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .deltify_plan import Candidate

#: runs a position whose last measured period did not pay back is left alone before it is
#: measured again (bench/MAINTENANCE.md: on a dense fine-tune, measuring cost about as much CPU as
#: the save itself, for nothing)
REMEASURE_AFTER = 8


@dataclass
class DeltifyMemo:
    """What earlier runs of this process found not worth doing (kept on the repository handle):
    periods whose deltas are too large next to what they would replace, for good (chunks never
    change), and packs too little of which a conversion would free, until more of them is dead or
    more of it becomes a candidate (a newer version pushes its chunks out of the newest ones)."""

    too_large: set[tuple[bytes, ...]] = field(default_factory=set)       # a period's chunk ids
    waiting: dict[str, tuple[int, int]] = field(default_factory=dict)  # pack -> (dead, candidate bytes) then
    # position -> [runs left before it is measured again, the ratio of delta to stored bytes found
    # there]: a position whose last measured period did not pay back is skipped without decoding or
    # encoding anything (in a dense fine-tune most positions, every save)
    unpaid: dict[tuple, list[float]] = field(default_factory=dict)
    # version id -> its chunks by position and its dense positions (deltify_plan._positions): a
    # manifest never changes, and decoding every version's positions at each save grew a save's
    # cost with the history
    positions: dict[str, tuple[dict, set]] = field(default_factory=dict)
    settled: dict[bytes, str] = field(default_factory=dict)   # deltify_plan.plan's settled chunks
    # (chunk, base, its context) -> (bytes, encoding) of the chunk's reverse delta against that
    # base, or None where none is smaller than the chunk: chunks never change, so neither does
    # the delta.  A conversion dropped because its pack fell short is judged again from these
    # sizes, and encoded only once it is kept (on a dense fine-tune the same 115 MB was decoded
    # and encoded at three saves in a row, for nothing).  Only the current candidates' are kept.
    encoded: dict[tuple, tuple[int, int] | None] = field(default_factory=dict)

    def measured_unpaid(self, candidates: list[Candidate], keep_if_above: float) -> list[Candidate]:
        """``candidates`` less those at a position whose last measured period did not pay back at
        ``keep_if_above``; counts every such position's runs down (at zero it is measured again:
        how much a step moves changes as training goes on).  Left out before the packs are judged,
        so that a pack is not counted as freed by conversions that will not happen."""
        for pos in list(self.unpaid):
            self.unpaid[pos][0] -= 1
            if self.unpaid[pos][0] < 0:
                del self.unpaid[pos]
        out = []
        for c in candidates:
            last = self.unpaid.get(c.position) if c.position is not None else None
            if last is None or last[1] <= keep_if_above:
                out.append(c)
        return out

    def keep_only(self, candidates: list[Candidate], packs: "Mapping[str, int]") -> None:
        """Forget what concerns chunks that are no longer candidates and packs holding none of
        them: a handle's memory of deltification stays the size of what a run looks at."""
        ids = {c.chunk_id for c in candidates}
        for key in [k for k in self.encoded if k[0] not in ids]:
            del self.encoded[key]
        self.too_large = {k for k in self.too_large if k[0] in ids}
        for pid in [p for p in self.waiting if p not in packs]:
            del self.waiting[pid]

    def note(self, period: list[Candidate], ratio: float) -> None:
        """The ratio a conversion of ``period`` reached (delta bytes / the bytes it replaces)."""
        if period[-1].position is not None:
            self.unpaid[period[-1].position] = [REMEASURE_AFTER, ratio]

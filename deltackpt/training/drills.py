"""Rollback drills beside a training loop: every so many saves, restore the newest version (or
``latest~k``) into fresh memory in a background thread at idle priority, check it against its
hashes and record what it cost (:mod:`deltackpt.repo.maintain.drill`).  The measured restore time then
feeds the interval policies that need a restart cost (``YoungDaly``).

Example::

    drills = Driller(repo, every=10, revision="latest")
    drills.saved()            # after each save: starts a drill every 10th
    seconds = drills.measured()   # the last drill's restore time, or None
"""

from __future__ import annotations

import threading

from .. import threads
from ..api import Repo, internal
from ..api.internal import DrillReport
from ..errors import DeltackptError, InvalidArgumentError


def last_restore_seconds(repo: Repo) -> float | None:
    """The restore time of the newest successful drill recorded in the repository, or None."""
    for e in internal.events_of(repo, "drill"):
        if e.data.get("ok") and e.data.get("seconds") is not None:
            return float(e.data["seconds"])
    return None


class Driller:
    """Runs one drill at a time, every ``every`` saves, in a daemon thread under SCHED_IDLE.  The
    drilled version is held (:mod:`deltackpt.repo.maintain.holds`) for the drill's length, so retention
    running meanwhile cannot turn a sound version into a failed drill."""

    def __init__(self, repo: Repo, every: int, revision: str = "latest") -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidArgumentError(f"drill_every must be a positive number of saves, got {every!r:.60}")
        self.repo, self.every, self.revision = repo, every, revision
        self.saves = 0
        self.last: DrillReport | None = None
        self.error: DeltackptError | None = None
        self._thread: threading.Thread | None = None

    def saved(self) -> bool:
        """Count a save; start a drill when one is due and none runs.  Returns whether it started."""
        self.saves += 1
        if self.saves % self.every or (self._thread is not None and self._thread.is_alive()):
            return False
        self._thread = threading.Thread(target=self._run, name="deltackpt-drill", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        threads.leave_signals_to_main()
        hold = internal.hold(self.repo)
        try:
            vid = internal.resolve_id(self.repo, self.revision)
            if hold.set([vid]):
                self.last = internal.drill(self.repo, vid, idle=True, label=self.revision)
        except DeltackptError as exc:   # no version yet, or the repository refused: reported by wait()
            self.error = exc
        finally:
            hold.release()

    def measured(self) -> float | None:
        """The restore seconds of the last successful drill of this process, or None."""
        return self.last.seconds if self.last is not None and self.last.ok else None

    def wait(self) -> DrillReport | None:
        """Wait for a drill in progress; returns the last report."""
        if self._thread is not None:
            self._thread.join()
        return self.last

"""A guarded training run killed from outside (tests/training/test_guard_crash.py).

    python -m tests.training.guard_child REPO MARKER K

Trains the run of ``_guarded.py`` with a NaN loss at step 33; ``K`` steps after the guard rolled
back it writes MARKER (the rollback as JSON) and waits there to be killed: the kill lands at the step
the marker names however slowly the parent, on a loaded machine, sees the marker (training on while
it looked, the child once committed the next save first and the K=0 case resumed past the rollback).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

from tests.training._guarded import make_run, train


def main(repo: str, marker: str, k: int) -> None:
    run = make_run(repo)
    state = {"nan": False, "written": False}

    def poison(step, idx):
        if step == 33 and not state["nan"]:
            state["nan"] = True
            return math.nan
        if run.rollbacks and not state["written"] and step > run.rollbacks[0].step + k:
            rb = run.rollbacks[0]
            with open(marker + ".tmp", "w") as f:
                json.dump({"skipped": rb.skipped, "to": rb.version.id, "committed": rb.committed.id,
                           "abandoned": rb.abandoned, "step": step}, f)
            os.replace(marker + ".tmp", marker)
            state["written"] = True
            time.sleep(3600)
        return None

    train(run, 10 ** 9, poison)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

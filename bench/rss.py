"""Child process for peak-RSS figures: ``python -m bench.rss save|load SYSTEM STATE.pt DIR``.

Prints JSON {"base": RSS MB before the operation, "peak": ru_maxrss MB}.  ``save`` first loads the
state from a torch.save file (that memory is in "base"), then saves it into a fresh DIR.
"""

import json
import resource
import sys

import psutil
import torch


def _hwm_mb() -> float:
    """This process's peak RSS.  Not ru_maxrss: Linux carries it across execve, so a child of a big
    parent would report the parent's peak; VmHWM belongs to the new address space."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    mode, name, state_path, d = sys.argv[1:5]
    from bench.systems import systems
    sysm = {s.name: s for s in systems(scale=False)}[name]
    state = torch.load(state_path, weights_only=True) if mode == "save" else None
    base = psutil.Process().memory_info().rss / 2**20
    if mode == "save":
        sysm.save(state, d)
    else:
        sysm.load(d)
    peak = _hwm_mb()
    print(json.dumps({"base": base, "peak": peak}))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()

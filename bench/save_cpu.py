"""CPU time of background delta saves of a MiniLM fine-tune (minilm-full), without a training loop
competing: what a save costs the machine, apart from what it costs the loop (bench/async_stall.py).

Trains the shipped MiniLM with AdamW, keeps copies of the state every ``--every`` steps, then saves
them one after the other with ``blocking=False`` and waits for each.  Prints user + sys CPU, page
faults and wall time per delta save (the first save, a keyframe, is left out).  To compare two
commits, run it from a worktree of each, interleaved (this machine's runs spread by ±7%):

    PYTHONPATH=. python bench/save_cpu.py --runs 3

Both commits can save the very same states: train once with ``--keep-states FILE``, then pass
``--states FILE`` to each run (the bytes written per version then compare exactly too).
``--delta-base keyframe`` saves them into a star repository instead.
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import deltackpt  # noqa: E402
from bench.scratch import scratch  # noqa: E402
from bench.stall_jobs import MiniLMJob  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=6, help="states saved per run (the first is a keyframe)")
    ap.add_argument("--every", type=int, default=8, help="training steps between two states")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--background", default="thread", choices=["thread", "process"])
    ap.add_argument("--states", help="load the states from this file (written by --keep-states) instead of training")
    ap.add_argument("--keep-states", help="write the trained states to this file (torch.save)")
    ap.add_argument("--delta-base", default="parent", choices=["parent", "keyframe"],
                    help="the repository's delta_base (keyframe: star deltas)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.states:
        states = torch.load(args.states, weights_only=True)
    else:
        job = MiniLMJob(8, 64)
        states = []
        for k in range(args.versions):
            for _ in range(args.every if k else 3):
                job.step()
            st = job.state()
            states.append({"model": {n: t.clone() for n, t in st["model"].items()},
                           "optimizer": copy.deepcopy(st["optimizer"])})
        del job
        if args.keep_states:
            torch.save(states, args.keep_states)
    medians = []
    for run in range(args.runs):
        with scratch("save-cpu-") as repo:
            deltackpt.Repo.init(repo, delta_base=args.delta_base)
            cpu, wall, faults, written = [], [], [], []
            for i, state in enumerate(states):
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                h = deltackpt.save(state, repo, step=i, blocking=False, background=args.background)
                try:
                    v = h.wait()
                except BaseException:   # interrupted: the save ends before its folder goes
                    h.wait()
                    raise
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                written.append(v.written_bytes / 1e6)
                if i:   # the encoder process's CPU is not this process's: use --background thread to count it
                    cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
                    wall.append(time.perf_counter() - t0)
                    faults.append(r1.ru_minflt - r0.ru_minflt)
            deltackpt.Repo(repo).close()
        medians.append(statistics.median(cpu))
        print(f"run {run + 1}: CPU s per delta save median {statistics.median(cpu):.3f} "
              f"({' '.join(f'{c:.2f}' for c in cpu)}); page faults median {statistics.median(faults):.0f}; "
              f"wall median {statistics.median(wall):.3f} s; MB written per version {' '.join(f'{w:.2f}' for w in written)}",
              flush=True)
    print(f"median of run medians: {statistics.median(medians):.3f} CPU s per delta save")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU time of background delta saves of a MiniLM fine-tune (minilm-full), without a training loop
competing: what a save costs the machine, apart from what it costs the loop (training_slowdown).

Trains the shipped MiniLM with AdamW, keeps copies of the state every ``--every`` steps, then saves
them one after the other with ``blocking=False`` and waits for each.  Prints user + sys CPU, page
faults and wall time per delta save (the first save, a keyframe, is left out).  To compare two
commits, run it from a worktree of each, interleaved (this machine's runs spread by ±7%):

    python -m bench save_cpu --runs 3

Both commits can save the very same states: train once with ``--keep-states FILE``, then pass
``--states FILE`` to each run (the bytes written per version then compare exactly too).
``--delta-base keyframe`` saves them into a star repository instead.  Every run checks that the
last version restores bit-identically.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from bench.common.jobs import MiniLMJob
from bench.common.measure import digests
from bench.common.scratch import scratch
from bench.common.workloads import clone_state

SUMMARY = "CPU seconds, page faults and bytes written per background delta save of a MiniLM fine-tune, no loop competing"
WRITES = "stdout"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--versions", type=int, default=None, help="states saved per run, the first a keyframe (default 6, quick 3)")
    ap.add_argument("--every", type=int, default=8, help="training steps between two states")
    ap.add_argument("--runs", type=int, default=None, help="runs (default 2, quick 1)")
    ap.add_argument("--background", default="thread", choices=["thread", "process"])
    ap.add_argument("--states", help="load the states from this file (written by --keep-states) instead of training")
    ap.add_argument("--keep-states", help="write the trained states to this file (torch.save)")
    ap.add_argument("--delta-base", default=None, choices=["parent", "keyframe", "child"],
                    help="the repository's delta_base (default: the library's; keyframe: star deltas)")


def _states(args: argparse.Namespace) -> list[dict]:
    if args.states:
        return torch.load(args.states, weights_only=True)
    job = MiniLMJob(2 if args.quick else 8, 8 if args.quick else 64, tiny=args.quick)
    states = []
    for k in range(args.versions or (3 if args.quick else 6)):
        for _ in range(args.every if k else 3):
            job.step()
        states.append(clone_state(job.state()))
    del job
    if args.keep_states:
        torch.save(states, args.keep_states)
    return states


def run(args: argparse.Namespace) -> int:
    import deltackpt
    torch.set_num_threads(1)
    states = _states(args)
    medians = []
    for k in range(args.runs or (1 if args.quick else 2)):
        with scratch("deltackpt-bench-save-cpu-", parent=args.tmp) as path:
            repo = deltackpt.Repo.init(path, **({"delta_base": args.delta_base} if args.delta_base else {}))
            cpu, wall, faults, written = [], [], [], []
            try:
                for i, state in enumerate(states):
                    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                    v = repo.save(state, step=i, blocking=False, background=args.background).wait()
                    r1 = resource.getrusage(resource.RUSAGE_SELF)
                    written.append(v.written_bytes / 1e6)
                    if i:   # the encoder process's CPU is not this process's: use --background thread to count it
                        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
                        wall.append(time.perf_counter() - t0)
                        faults.append(r1.ru_minflt - r0.ru_minflt)
                ok = digests(repo.load("latest")) == digests(states[-1])
            finally:
                repo.close()
        if not ok:
            print(f"run {k + 1}: the last version did NOT restore bit-identically")
            return 1
        medians.append(statistics.median(cpu))
        print(f"run {k + 1}: CPU s per delta save median {statistics.median(cpu):.3f} "
              f"({' '.join(f'{c:.2f}' for c in cpu)}); page faults median {statistics.median(faults):.0f}; "
              f"wall median {statistics.median(wall):.3f} s; MB written per version {' '.join(f'{w:.2f}' for w in written)}",
              flush=True)
    print(f"median of run medians: {statistics.median(medians):.3f} CPU s per delta save")
    return 0

"""Every benchmark study of deltackpt, run one way.

    python -m bench --list                       # the studies, what each measures, what it writes
    python -m bench compare                      # one study (here the comparison behind RESULTS.md)
    python -m bench compare --help               # its options
    python -m bench training_slowdown --quick    # its quick mode: tiny sizes, checks, no speed claims
    python -m bench all --quick                  # CI (make bench-quick): every study's quick mode

A study is a module of bench/studies/ with ``SUMMARY`` (one line: what it measures), ``WRITES``
(where its results go), ``add_arguments(parser)`` and ``run(args) -> exit status``; it is declared
once, in ``STUDIES`` below.  Its quick mode asserts that every system it compares ran and that
every restore it checks is bit-identical, and removes everything it created.  The measuring parts
they share (scratch folders, cold page cache, memory, the systems compared, the training runs,
recorded results) are in bench/common/.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import time
from types import ModuleType

#: study name -> module; the order is the order ``all`` runs them in (cheap checks first)
STUDIES: dict[str, str] = {
    "compare": "bench.studies.compare",
    "training_slowdown": "bench.studies.training_slowdown",
    "first_save_stall": "bench.studies.first_save_stall",
    "save_cpu": "bench.studies.save_cpu",
    "maintenance_payback": "bench.studies.maintenance_payback",
    "history_growth": "bench.studies.history_growth",
    "handle_hygiene": "bench.studies.handle_hygiene",
    "load_speed": "bench.studies.load_speed",
    "collector_cost": "bench.studies.collector_cost",
    "guard_recovery": "bench.studies.guard_recovery",
    "guard_slow_divergence": "bench.studies.guard_slow_divergence",
    "guard_clean_traces": "bench.studies.guard_clean_traces",
    "policy_sim": "bench.studies.policy_sim",
    "delta_sizes": "bench.studies.delta_sizes",
    "codec_speed": "bench.studies.codec_speed",
    "write_policy": "bench.studies.write_policy",
    "larger_than_memory": "bench.studies.larger_than_memory",
    "trainer_checkpoints": "bench.studies.trainer_checkpoints",
    "cuda_checkpoint": "bench.studies.cuda_checkpoint",
    "pinned_staging": "bench.studies.pinned_staging",
}


def study(name: str) -> ModuleType:
    """The module of study ``name`` (hyphens or underscores)."""
    key = name.replace("-", "_")
    if key not in STUDIES:
        raise SystemExit(f"no study {name!r}; python -m bench --list names them")
    return importlib.import_module(STUDIES[key])


def parser(name: str, mod: ModuleType) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m bench {name}", description=mod.SUMMARY)
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, for CI: checks that everything ran and restored bit-identically, no speed claims")
    ap.add_argument("--tmp", default=os.environ.get("BENCH_TMP"),
                    help="where the scratch folders go (default: the system's temp folder); removed however the run ends")
    mod.add_arguments(ap)
    return ap


def _list() -> int:
    width = max(map(len, STUDIES))
    for name in STUDIES:
        mod = study(name)
        print(f"{name:{width}}  {mod.SUMMARY}\n{'':{width}}  writes: {mod.WRITES}")
    return 0


def _cpu() -> float:
    """User + system seconds of this process and of the children it reaped."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _all_quick(tmp: str | None) -> int:
    """Every study's quick mode in this process, one after the other; each must leave its scratch
    folder empty.  A failing study does not stop the others; the exit status says whether any did."""
    import torch

    from bench.common.scratch import scratch
    threads = torch.get_num_threads()
    rows, failed = [], []
    t_all = time.perf_counter()
    with scratch("deltackpt-bench-all-", parent=tmp) as parent:
        for name in STUDIES:
            mod = study(name)
            print(f"== {name} --quick", flush=True)
            t0, c0 = time.perf_counter(), _cpu()
            try:
                status = mod.run(parser(name, mod).parse_args(["--quick", "--tmp", parent]))
            except (Exception, SystemExit) as exc:   # noqa: BLE001  (reported, and the run fails)
                import traceback
                traceback.print_exc()
                status = f"{type(exc).__name__}: {exc}"
            finally:
                torch.set_num_threads(threads)   # a study may set its own; the next starts from the default
            left = os.listdir(parent)
            if left:
                status = status or f"left {left} in its scratch folder"
                for entry in left:
                    shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
            rows.append((name, time.perf_counter() - t0, _cpu() - c0, status))
            if status:
                failed.append(name)
    # CPU seconds beside the wall: on a shared machine the wall time says as much about the others
    print("\n| study | quick wall s | CPU s (children too) | result |\n|---|---|---|---|")
    for name, s, cpu, status in rows:
        print(f"| {name} | {s:.1f} | {cpu:.1f} | {'ok' if not status else status} |")
    print(f"| all | {time.perf_counter() - t_all:.1f} | {sum(r[2] for r in rows):.1f} | "
          f"{'ok' if not failed else 'FAILED: ' + ', '.join(failed)} |")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("studies: " + ", ".join(STUDIES))
        return 0
    if argv[0] == "--list":
        return _list()
    from bench.common.scratch import compile_cache
    with compile_cache():
        return _run(argv[0], argv[1:])


def _run(name: str, rest: list[str]) -> int:
    if name == "all":
        ap = argparse.ArgumentParser(prog="python -m bench all", description="every study's quick mode")
        ap.add_argument("--quick", action="store_true", required=True, help="required: the full runs take hours")
        ap.add_argument("--tmp", default=os.environ.get("BENCH_TMP"))
        a = ap.parse_args(rest)
        return _all_quick(a.tmp)
    mod = study(name)
    return int(mod.run(parser(name, mod).parse_args(rest)) or 0)


if __name__ == "__main__":
    sys.exit(main())

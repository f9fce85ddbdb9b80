"""What every study measures with: tensor digests for bit-identity, timers (wall and CPU), the
machine's memcpy and write+fsync limits, and a state's tensor bytes."""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch
import xxhash

from bench.common.systems import split


def digests(state) -> dict[str, str]:
    """xxh3-128 of every tensor's bytes (plus dtype/shape), and the non-tensor leaves as text."""
    t, other = split(state)
    out = {}
    for k, v in t.items():
        b = v.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        out[k] = f"{v.dtype}|{tuple(v.shape)}|{xxhash.xxh3_128_hexdigest(memoryview(b))}"
    for k, v in other.items():
        out[k] = repr(v)
    return out


def same(expected: dict[str, str], got, only: list[str] | None = None) -> bool:
    """Every tensor (or only those named) has the expected dtype, shape and bytes; leaves equal."""
    d = got if only is not None else digests(got)
    if only is not None:
        return set(d) == set(only) and all(d[k] == expected[k] for k in only)
    return d == expected


def timed(fn, *a):
    t0 = time.perf_counter()
    r = fn(*a)
    return time.perf_counter() - t0, r


def machine_limits(quick: bool, tmp: str) -> dict[str, float]:
    n = (32 if quick else 512) << 20
    src = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
    dst = np.empty_like(src)
    mem = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        mem.append(n / (time.perf_counter() - t0) / 1e9)
    disk = []
    path = os.path.join(tmp, "ddtest")
    for _ in range(3):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(memoryview(src))
            f.flush()
            os.fsync(f.fileno())
        disk.append(n / (time.perf_counter() - t0) / 1e9)
        os.unlink(path)
    return {"memcpy_GBps": statistics.median(mem), "write_fsync_GBps": statistics.median(disk),
            "probe_MB": n / 2**20}


def cpu_seconds() -> float:
    """User + system CPU of this process so far, all threads (CLOCK_PROCESS_CPUTIME_ID: os.times()
    counts in 10 ms ticks, too coarse for a small save)."""
    return time.process_time()


def timed_cpu(fn, *a):
    """(wall seconds, CPU seconds, result) of ``fn(*a)``."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    r = fn(*a)
    return time.perf_counter() - t0, cpu_seconds() - c0, r


def proc_io(field: str) -> int:
    """One counter of this process's /proc/self/io (``"wchar"``: bytes handed to ``write()``,
    ``"rchar"``: bytes got from ``read()``, page cache hits included)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def measured(fn):
    """``(result, cost)`` of ``fn()``: ``cost`` holds wall seconds, CPU seconds split into user
    and system (this process's threads and its reaped children, getrusage's microsecond clock),
    bytes handed to ``write()`` (``/proc/self/io`` wchar) and minor page faults (``faults``: fresh
    pages the kernel zeroes, a count the machine's noise does not move).  System time is mostly the
    kernel taking in written pages; on a VM it varies ~10x for the same bytes with whether the
    guest's free pages are still backed by the host, so studies report it apart from user time."""
    import resource

    def usage() -> tuple[float, float, int]:
        a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return a.ru_utime + b.ru_utime, a.ru_stime + b.ru_stime, a.ru_minflt + b.ru_minflt
    (u0, s0, f0), w0, t0 = usage(), proc_io("wchar"), time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    u1, s1, f1 = usage()
    return out, {"wall": wall, "user": u1 - u0, "sys": s1 - s0, "cpu": (u1 - u0) + (s1 - s0),
                 "written": proc_io("wchar") - w0, "faults": f1 - f0}


def tensor_bytes(state) -> int:
    """Bytes of the state's tensors, each storage once (GPT-2's tied embedding and output weights
    are one tensor under two names)."""
    t, _ = split(state)
    seen = {(x.data_ptr(), x.numel() * x.element_size()) for x in t.values()}
    return sum(n for _, n in seen)

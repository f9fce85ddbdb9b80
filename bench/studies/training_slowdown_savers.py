"""The ways a training loop checkpoints in bench/studies/training_slowdown.py, one object each, all
through public APIs.  A saver's ``save(job, step)`` is the call the loop blocks on; ``busy()`` says
whether work it started is still running; ``wait()`` waits for that work (returning its seconds
where the API reports them); ``close()`` (in ``finally``) leaves nothing running or open.

* ``none``: no checkpoint (the baseline);
* ``torch.save`` / ``torch.save+fsync``: blocking, into a temp file renamed over the last;
* ``dcp-async``: ``torch.distributed.checkpoint.async_save`` in one process (no process group: it
  saves without one), a folder per save, the one before removed once the next is written; the
  next save first waits for the last, as DCP asks;
* ``deltackpt-blocking``, ``deltackpt-background`` (``blocking=False``), ``deltackpt-lazy``
  (``blocking=False, optimizer=``: the optimizer's tensors copied during the next forward and
  backward), ``deltackpt-process`` (``background="process"``): one ``deltackpt.Repo`` held from
  the first save to ``close()``;
* ``cpu-burn``, ``mem-burn``, ``fault-burn``, ``gil-burn``: no save; a thread burns CPU seconds
  one way at each save point, to tell which kind of background work costs the loop.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from typing import Any

import numpy as np

from bench.common.systems import torch_save_file  # also silences DCP's one-process warning

SYSTEMS = ("none", "torch.save", "torch.save+fsync", "dcp-async", "deltackpt-blocking", "deltackpt-background",
           "deltackpt-lazy", "deltackpt-process", "cpu-burn", "mem-burn", "fault-burn", "gil-burn")


class Saver:
    name = "none"

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir

    def save(self, job: Any, step: int) -> None:
        """Checkpoint ``job`` at ``step``: what the loop waits for."""

    def busy(self) -> bool:
        return False

    def wait(self) -> float | None:
        """Wait for the work the last save left running; its background seconds where known."""
        return None

    def step_wait(self) -> float:
        """Seconds the loop waited after the call returned (a lazy snapshot's next optimizer step)."""
        return 0.0

    def last(self) -> str:
        """Where the last checkpoint is (for the quick run's restore check)."""
        return self.workdir

    def close(self) -> None:
        self.wait()


class TorchSaver(Saver):
    def __init__(self, workdir: str, fsync: bool) -> None:
        super().__init__(workdir)
        self.fsync = fsync
        self.name = "torch.save+fsync" if fsync else "torch.save"
        self.path = os.path.join(workdir, "torch.pt")

    def save(self, job, step):
        torch_save_file(job.state(), self.path, fsync=self.fsync)

    def last(self):
        return self.path


class DCPAsync(Saver):
    name = "dcp-async"

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self.future: Any = None
        self.started = 0.0
        self.dirs: list[str] = []

    def save(self, job, step):
        import torch.distributed.checkpoint as dcp
        self.wait()   # DCP's own advice: one async save in flight
        d = os.path.join(self.workdir, f"dcp-{step:08d}")
        self.started = time.perf_counter()
        self.future = dcp.async_save(job.state(), checkpoint_id=d, no_dist=True)
        self.dirs.append(d)

    def busy(self):
        return self.future is not None and not self.future.done()

    def wait(self):
        if self.future is None:
            return None
        f, self.future = self.future, None
        f.result()
        took = time.perf_counter() - self.started
        for old in self.dirs[:-1]:   # keep the newest checkpoint, as torch.save's rename does
            shutil.rmtree(old, ignore_errors=True)
        del self.dirs[:-1]
        return took

    def last(self):
        return self.dirs[-1]


class DeltackptSaver(Saver):
    def __init__(self, workdir: str, mode: str) -> None:
        super().__init__(workdir)
        self.name, self.mode = f"deltackpt-{mode}", mode
        self.path = os.path.join(workdir, "repo")
        self.repo: Any = None
        self.handle: Any = None
        self.step_waits = 0.0

    def save(self, job, step):
        import deltackpt
        if self.repo is None:
            self.repo = deltackpt.Repo(self.path, create=True)
        if self.mode == "blocking":
            self.repo.save(job.state(), step=step)
            return
        kw: dict = {"blocking": False}
        if self.mode == "lazy":
            kw["optimizer"] = job.opt
        elif self.mode == "process":
            kw["background"] = "process"
        self.handle = self.repo.save(job.state(), step=step, **kw)

    def busy(self):
        return self.handle is not None and not self.handle.done()

    def wait(self):
        if self.handle is None:
            return None
        h, self.handle = self.handle, None
        h.wait()
        self.step_waits += h.step_wait_seconds   # final: the lazy copy is done once the save is
        return h.background_seconds

    def step_wait(self):
        return self.step_waits

    def last(self):
        return self.path

    def close(self):
        try:
            self.wait()
        finally:
            if self.repo is not None:
                self.repo.close()
                self.repo = None


class Burner(Saver):
    """No save: at each save point a thread burns ``seconds`` of CPU one way: ``cpu`` (zstd over a
    32 KiB buffer: in cache, GIL released), ``mem`` (copying 64 MiB buffers: memory bandwidth),
    ``fault`` (fresh 2 MiB buffers written once: page faults, as a save's new buffers take) or
    ``gil`` (pure Python: holds the GIL)."""

    def __init__(self, workdir: str, kind: str, seconds: float) -> None:
        import zstandard
        super().__init__(workdir)
        self.name, self.kind, self.seconds = f"{kind}-burn", kind, seconds
        self.cctx = zstandard.ZstdCompressor(level=1)
        self.buf = os.urandom(1 << 14) * 2
        self.big = np.ones(1 << 26, dtype=np.uint8) if kind == "mem" else None
        self.thread: threading.Thread | None = None

    def _burn(self) -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < self.seconds:
            if self.kind == "cpu":
                self.cctx.compress(self.buf)
            elif self.kind == "mem":
                self.big.copy()
            elif self.kind == "fault":
                np.empty(1 << 21, dtype=np.uint8).fill(1)
            else:
                sum(i * i for i in range(10000))

    def save(self, job, step):
        self.wait()
        self.thread = threading.Thread(target=self._burn, daemon=True)
        self.thread.start()

    def busy(self):
        return self.thread is not None and self.thread.is_alive()

    def wait(self):
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        return None


def make(name: str, workdir: str, burn_s: float = 1.0) -> Saver:
    """The saver called ``name`` (one of SYSTEMS), writing under ``workdir``."""
    os.makedirs(workdir, exist_ok=True)
    if name == "none":
        return Saver(workdir)
    if name in ("torch.save", "torch.save+fsync"):
        return TorchSaver(workdir, fsync=name.endswith("fsync"))
    if name == "dcp-async":
        return DCPAsync(workdir)
    if name.startswith("deltackpt-") and name.split("-", 1)[1] in ("blocking", "background", "lazy", "process"):
        return DeltackptSaver(workdir, name.split("-", 1)[1])
    if name.endswith("-burn") and name.split("-")[0] in ("cpu", "mem", "fault", "gil"):
        return Burner(workdir, name.split("-")[0], burn_s)
    raise SystemExit(f"unknown system {name!r} ({', '.join(SYSTEMS)})")


def restored(saver: Saver) -> Any:
    """The state the saver's last checkpoint restores (quick runs check it bit-identical)."""
    import torch

    from bench.common.systems import DCP, Deltackpt
    if isinstance(saver, TorchSaver):
        return torch.load(saver.last(), weights_only=True)
    if isinstance(saver, DCPAsync):
        return DCP().load(saver.last())
    if isinstance(saver, DeltackptSaver):
        return Deltackpt().load(saver.last())
    return None

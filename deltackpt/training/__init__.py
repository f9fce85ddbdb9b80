"""The training loop's side of deltackpt: when to save (Checkpointer), what a resumable state holds
(training_state, ResumableSampler), and getting back to where a killed job was (resume).

Example::

    from deltackpt import Checkpointer, Retention, resume
    from deltackpt.training.policies import EveryN, OnImprovement
    from deltackpt.training import ResumableSampler, training_state

    sampler = ResumableSampler(len(dataset), seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, generator=torch.Generator())
    info = resume("ckpt", model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    step = info.step if info else 0
    ckpt = Checkpointer("ckpt", policy=[EveryN(200), OnImprovement("val_loss")],
                        retention=Retention(keep_last=3, keep_best=("val_loss", 1, "min")))
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...; step += 1
            ckpt.step(lambda: training_state(model=model, optimizer=opt, scheduler=sched,
                                             sampler=sampler, step=step), step=step, metrics={"loss": loss})
    ckpt.close()

A divergence guard rolls the run back by itself when its loss goes bad (``guard.py``)::

    guard = Guard(model=model, optimizer=opt, scheduler=sched, sampler=sampler, watch="loss")
    ckpt = Checkpointer("ckpt", policy=EveryN(50), guard=guard, drill_every=20)
    ...
    ckpt.step(state_fn, step=step, metrics={"loss": loss})
    if ckpt.rollback:            # rolled back in place: continue from its step, new data iterator
        step = ckpt.rollback.step

What it may import: :mod:`deltackpt.api` (the public API, and ``deltackpt.api.internal`` for what a
training loop needs beyond it), :mod:`deltackpt.torchstate`, ``format`` and the top-level helpers;
never ``deltackpt.repo``, ``deltackpt.snapshot`` or ``deltackpt.store`` directly (import-linter), nor
a handle's ``core``.  Only :mod:`deltackpt.integrations` and the CLI build on it.  Inside it: checkpointer -> guard ->
(rollback | drills | targets | agree | onset | report) -> resume -> state -> (policies | rng | detect).
"""

from .checkpointer import Checkpointer
from .detect import Ratio, Rules, Spike, Sustained
from .guard import Guard
from .report import Rollback
from .resume import ResumeInfo, resume
from .state import ResumableSampler, training_state

__all__ = ["Checkpointer", "Guard", "Ratio", "ResumableSampler", "ResumeInfo", "Rollback", "Rules", "Spike",
           "Sustained", "resume", "training_state"]

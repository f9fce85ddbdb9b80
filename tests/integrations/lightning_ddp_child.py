"""A Lightning DDP run (2 CPU processes, gloo) with DeltackptGuard (tests/integrations/test_guard_adapters.py).

    python -m tests.integrations.lightning_ddp_child REPO OUT_DIR

Lightning's DDP launcher starts the second process by running this module again.  Before step 10
the weights of global rank 1 only turn NaN: its loss is NaN, rank 0's is not.  Each rank writes
OUT_DIR/rank<N>.json: its rollbacks and a hash of its final weights.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import pytorch_lightning as pl
import torch

from deltackpt.integrations.lightning import DeltackptGuard
from deltackpt.training import Guard
from tests.integrations.test_lightning import Tiny, _loader

POISON_AT = 9


def main(repo: str, out_dir: str) -> None:
    guard = Guard()

    class Poison(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == POISON_AT and trainer.global_rank == 1 and not guard.rollbacks:
                with torch.no_grad():
                    pl_module.net[0].weight.mul_(math.nan)

    torch.manual_seed(0)
    model = Tiny()
    trainer = pl.Trainer(max_steps=16, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=out_dir, callbacks=[DeltackptGuard(repo, guard, every_n_steps=4), Poison()])
    trainer.fit(model, _loader())
    digest = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        digest.update(name.encode() + t.detach().contiguous().numpy().tobytes())
    with open(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"rollbacks": [{"from_step": rb.from_step, "step": rb.step, "version": rb.version.id,
                                  "seen_on": rb.seen_on, "committed": rb.committed.id if rb.committed else None}
                                 for rb in guard.rollbacks],
                   "weights": digest.hexdigest(), "global_step": trainer.global_step}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

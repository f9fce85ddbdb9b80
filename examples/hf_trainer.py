"""Hugging Face transformers.Trainer saving into a deltackpt repository, and resuming from it.

``DeltackptCallback`` stores model, optimizer, scheduler, trainer state and RNG at every save
step (and removes the Trainer's own checkpoint-N directories); ``checkout`` writes a version
back as a checkpoint directory for ``trainer.train(resume_from_checkpoint=...)``.

    python examples/hf_trainer.py --repo /tmp/hf-ckpt --steps 40 --stop-at 25   # "crashes" at step 25
    python examples/hf_trainer.py --repo /tmp/hf-ckpt --steps 40 --resume       # resumes from step 20

A tiny BERT built from a config (no download) on generated token ids; CPU, well under a minute.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import deltackpt  # noqa: E402
from deltackpt.integrations.hf import DeltackptCallback, checkout  # noqa: E402


class StopAt(transformers.TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            print(f"stopping at step {state.global_step} (as if the job were killed)")
            sys.stdout.flush()
            os._exit(3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--save-steps", type=int, default=10)
    ap.add_argument("--stop-at", type=int, default=0, help="exit abruptly after this step")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=32, num_labels=2)
    model = transformers.BertForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 500, (256, 16), generator=g)
    data = [{"input_ids": ids[i], "labels": int(ids[i, 0] > 250)} for i in range(len(ids))]
    out = args.repo + "-trainer"
    targs = transformers.TrainingArguments(output_dir=out, max_steps=args.steps, save_steps=args.save_steps,
                                           save_strategy="steps", per_device_train_batch_size=8, learning_rate=5e-4,
                                           logging_steps=5, report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    callbacks = [DeltackptCallback(args.repo, remove_hf_checkpoints=True)]
    if args.stop_at:
        callbacks.append(StopAt(args.stop_at))
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=data, callbacks=callbacks)
    resume_dir = None
    if args.resume and os.path.exists(args.repo):
        resume_dir = checkout(args.repo, out + "-resume")
        print(f"resuming from {deltackpt.Repo(args.repo).resolve().step}")
    trainer.train(resume_from_checkpoint=resume_dir)
    for v in deltackpt.Repo(args.repo).log()[:5]:
        print(f"{v.short_id}  step {v.step}  loss {v.metrics.get('loss')}  written {v.written_bytes} B")
    print(f"done at step {trainer.state.global_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

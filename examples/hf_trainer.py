"""Hugging Face transformers.Trainer saving into a deltackpt repository, and resuming from it.

``DeltackptTrainer`` is the Trainer with the repository as its checkpoint writer: model, optimizer,
scheduler, trainer state, RNG and model config at every save step, no checkpoint-N folder, and
``trainer.train(resume_from_checkpoint="latest")`` resumes from the repository (no pickle, no
folder).  ``export`` then writes a folder ``from_pretrained`` loads.

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
from deltackpt.integrations.hf import DeltackptTrainer, export  # noqa: E402


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
    callbacks = [StopAt(args.stop_at)] if args.stop_at else []
    trainer = DeltackptTrainer(model=model, args=targs, train_dataset=data, callbacks=callbacks, repo=args.repo)
    resume = None
    if args.resume and trainer.checkpoint_repo.log():
        resume = "latest"
        print(f"resuming from {trainer.checkpoint_repo.resolve(resume).step}")
    trainer.train(resume_from_checkpoint=resume)
    for v in deltackpt.Repo(args.repo).log()[:5]:
        print(f"{v.short_id}  step {v.step}  loss {v.metrics.get('loss')}  written {v.written_bytes} B")
    folders = [d for d in os.listdir(out) if d.startswith("checkpoint-")] if os.path.isdir(out) else []
    print(f"checkpoint folders in {out}: {folders}")
    print(f"model folder for from_pretrained: {export(args.repo, out + '-model')}")
    print(f"done at step {trainer.state.global_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

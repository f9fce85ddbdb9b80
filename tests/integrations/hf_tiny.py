"""A tiny transformers fine-tune for the Trainer tests: a 1-layer BERT (or GPT-2) built from a config
with a fixed seed (no download), 24 examples (6 steps an epoch at batch 4, so 8 steps cross an
epoch), and the TrainingArguments the tests vary.

Run as a program it is the training process the SIGKILL test kills::

    python -m tests.integrations.hf_tiny OUT_DIR REPO ANNOUNCE_STEP

trains a DeltackptTrainer in the background mode (blocking=False) with saves every 4 steps; after
step ANNOUNCE_STEP, once ``latest`` names the step-4 version, it prints ``AT <step>`` and
waits to be killed.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

SAVE_STEPS, MAX_STEPS = 4, 8


def model(kind: str = "bert") -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":   # tied input and output embeddings
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2,
                                                                    n_positions=16))
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=2)
    return transformers.BertForSequenceClassification(cfg)


def data(kind: str = "bert", n: int = 24) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (n, 8), generator=g)
    if kind == "gpt2":
        return [{"input_ids": ids[i], "labels": ids[i]} for i in range(n)]
    return [{"input_ids": ids[i], "labels": int(ids[i].sum()) % 2} for i in range(n)]


def args(out: str, **overrides) -> transformers.TrainingArguments:
    kw = dict(output_dir=out, max_steps=MAX_STEPS, save_steps=SAVE_STEPS, save_strategy="steps",
              per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], use_cpu=True, logging_steps=2,
              seed=3, dataloader_num_workers=0, disable_tqdm=True)
    kw.update(overrides)
    if "eval_strategy" in kw and "eval_strategy" not in transformers.TrainingArguments.__dataclass_fields__:
        kw["evaluation_strategy"] = kw.pop("eval_strategy")   # its name before transformers 4.41
    return transformers.TrainingArguments(**kw)


class Crash(transformers.TrainerCallback):
    """Raises after a given step, as a job stopped there would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt(f"crash at step {self.at}")


class AnnounceAndWait(transformers.TrainerCallback):
    """After step ``at``: wait until the step-4 version is in the repository, say so on stdout, and
    wait for the SIGKILL."""

    def __init__(self, at: int, repo: str) -> None:
        self.at, self.repo = at, repo

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.at:
            return
        import deltackpt
        deadline = time.monotonic() + 120
        while not self._landed(deltackpt):
            assert time.monotonic() < deadline, "the step-4 save never landed"
            time.sleep(0.05)
        print(f"AT {state.global_step}", flush=True)
        time.sleep(600)


    def _landed(self, deltackpt) -> bool:
        """The step-4 save is committed: ``latest`` names it (its manifest alone is not enough)."""
        try:
            return deltackpt.Repo(self.repo).resolve("latest").step == SAVE_STEPS
        except deltackpt.UnknownVersionError:
            return False


def main(argv: list[str]) -> None:
    from deltackpt.integrations.hf import DeltackptTrainer
    out, repo, at = argv[0], argv[1], int(argv[2])
    trainer = DeltackptTrainer(model=model(), args=args(out), train_dataset=data(), repo=repo, blocking=False,
                               callbacks=[AnnounceAndWait(at, repo)])
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1:])

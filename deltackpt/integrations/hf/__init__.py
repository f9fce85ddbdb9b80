"""Hugging Face ``transformers.Trainer`` with a deltackpt repository as its checkpoints.

- :class:`DeltackptTrainer` (or :class:`DeltackptTrainerMixin` on your own Trainer subclass): the
  repository is the Trainer's checkpoint writer.  Each save step is one version (model,
  optimizer, scheduler, RNG states, TrainerState, model config; :mod:`.layout`), no
  ``checkpoint-N`` folder is written, and ``train(resume_from_checkpoint="latest")`` (a tag,
  ``"best:eval_loss"``, ``True``) resumes exactly from the repository, with no pickle and no folder.
- :func:`export`: a version as a folder ``AutoModel*.from_pretrained`` loads (``config.json``,
  ``model.safetensors``, the tokenizer's files).
- :class:`DeltackptCallback`: the observer path for a Trainer class you cannot change (the Trainer
  still writes its folders), and the divergence guard; :func:`checkout` (deprecated) writes a
  version back as a Trainer checkpoint folder for a plain Trainer to resume from.

Example::

    from deltackpt.integrations.hf import DeltackptTrainer, export

    trainer = DeltackptTrainer(model=model, args=args, train_dataset=ds, repo="ckpt")
    trainer.train(resume_from_checkpoint=True if os.path.exists("ckpt") else None)
    export("ckpt", "model-out", "trainer-best", tokenizer=tokenizer)
"""

from ...deps import require

require("transformers", feature="deltackpt's transformers integration")

from .callback import DeltackptCallback, checkout  # noqa: E402
from .export import export  # noqa: E402
from .trainer import DeltackptTrainer, DeltackptTrainerMixin  # noqa: E402

__all__ = ["DeltackptCallback", "DeltackptTrainer", "DeltackptTrainerMixin", "checkout", "export"]

"""deltackpt inside other frameworks and file formats.

- ``dcp``: torch.distributed.checkpoint's ``StorageWriter``/``StorageReader`` (public as
  ``deltackpt.dcp.Writer`` and ``Reader``);
- ``lightning``: a Lightning ``CheckpointIO`` (``plain``: Lightning's hyper-parameter objects as
  plain values and back; ``lightning_metrics``: what each version records of the run's metrics);
- ``hf``: a transformers ``Trainer`` subclass whose checkpoints are versions (and ``export`` of one
  as a ``from_pretrained`` folder), and the older ``TrainerCallback``;
- ``files``: import and export of ``torch.save`` and safetensors files (``deltackpt import``/``export``).

What it may import: the public API (:mod:`deltackpt.api`), :mod:`deltackpt.training`,
:mod:`deltackpt.snapshot`, :mod:`deltackpt.torchstate` and the core.  Nothing imports it but the
CLI and the ``deltackpt.dcp`` entry point: each framework stays optional.  Its modules do not
import each other (but ``lightning`` uses ``plain`` and ``lightning_metrics``).
"""

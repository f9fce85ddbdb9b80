"""What each column of the command line's tables (and each field of ``show``'s header) means.

The commands print these names as their headers, and docs/cli.md lists them from here
(``python -m deltackpt.cli.reference``), so a column cannot appear without its meaning."""

from __future__ import annotations

LOG = {
    "version": "the version's id (its first 10 hex digits; any 4+ digit prefix names it)",
    "time": "when its save committed, local time",
    "step": "the training step the save recorded (empty when none was given)",
    "size": "its tensors and values as they are in memory (about what torch.save would write)",
    "written": "what its save added to the repository (changed chunks, compressed or as deltas)",
    "tags": "the tags naming it",
    "exact": "empty when every tensor comes back bit-identical; `lossy` when a save asked for a lossy "
             "encoding (q8-delta, fp16, ...) for some tensor: `deltackpt show` names them and their error",
    "metrics": "the metrics its save recorded (`best:METRIC` picks versions by them)",
}

SHOW_HEADER = {
    "version": "the full id",
    "parent": "the version it was saved after (`latest~1` of it), or None for the first",
    "time": "when its save committed (ISO 8601, UTC)",
    "step": "the training step the save recorded",
    "tags": "the tags naming it",
    "exact": "`yes` when every tensor comes back bit-identical; `no (lossy encodings)` when some "
             "tensor was saved with a lossy encoding (its `max_abs_err` is then filled in below)",
    "metrics": "the metrics its save recorded",
    "drill": "the last rollback drill of this version (`deltackpt drill`), if any",
    "tensors": "how many tensors are listed (with `--layer`, those under the layers), their size in "
               "memory and the stored bytes of their chunks",
}

SHOW = {
    "tensor": "the tensor's dotted path in the saved state (`model.encoder.0.weight`); "
              "`--layer` selects by its leading parts",
    "dtype": "its torch dtype, without `torch.`",
    "shape": "its shape (`768x3072`; `()` for a scalar)",
    "size": "its bytes in memory",
    "stored": "the bytes of its chunks' stored objects as the repository holds them now (a chunk "
              "stored as a delta counts the delta, not its base; a chunk shared with other "
              "versions counts in full)",
    "encoding": "how its save encoded it: `lossless`, or a lossy mode (`q8-delta`, `q4-delta`, "
                "`fp16`, `bf16`) asked for with `encoding=`",
    "max_abs_err": "for a lossy tensor, the largest absolute difference from the saved tensor the "
                   "encoding allowed; empty for an exact one (bit-identical)",
}

DIFF = {
    "tensor": "the tensor's dotted path",
    "changed": "the share of its elements that differ (`added` or `removed` when only one version "
               "has it; why not, when not compared)",
    "max_abs": "the largest absolute difference of an element (`-` when not compared)",
    "rel_l2": "the L2 norm of the difference over the L2 norm of the older tensor",
    "stored_a": "the bytes of its stored objects in the older version",
    "stored_b": "the same in the newer version",
}

DU = {
    "version": "the version's id (first 10 hex digits)",
    "step": "the training step the save recorded",
    "size": "its tensors and values as they are in memory (about what torch.save would write)",
    "written": "what its save added to the repository (its changed chunks whole, plus the previous "
               "version's replaced chunks stored again as deltas)",
    "needs": "the stored bytes a load of it reads, shared ones included",
    "only its own": "the stored bytes no other version uses (about what removing it alone frees)",
}

EVENTS = {
    "event": "the event record's id (first 10 hex digits)",
    "time": "when it happened, local time",
    "kind": "`rollback` (a divergence guard rolled the run back), `drill` (a rollback drill) or "
            "`damaged` (a record that does not parse)",
    "what": "a rollback's step, metric and rule, the version it went back to and what it read; a "
            "drill's verdict, time and bytes read",
}

#: command -> [(what, {column: meaning})], in the order the command prints them
TABLES = {"log": [("column", LOG)], "show": [("header line", SHOW_HEADER), ("column", SHOW)],
          "diff": [("column", DIFF)], "du": [("column", DU)], "events": [("column", EVENTS)]}

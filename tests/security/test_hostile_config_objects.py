"""Hostile tagged config objects (issue 23 item 10): a repository whose checkpoint holds an
allow-listed tag (argparse.Namespace, AttributeDict, OmegaConf DictConfig/ListConfig) with a
malformed value gives one CorruptObjectError line naming the version and the entry, through
Lightning's DeltackptIO.load_checkpoint; nothing named in the repository runs.  It used to raise a
raw TypeError / ValueError or OmegaConf's multi-line error."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("pytorch_lightning")

import deltackpt  # noqa: E402
from deltackpt.errors import CorruptObjectError  # noqa: E402
from deltackpt.integrations.lightning import DeltackptIO  # noqa: E402
from deltackpt.integrations.plain import TYPE_KEY  # noqa: E402

T = TYPE_KEY
MALFORMED = {
    "namespace-int-keys": ({T: "argparse.Namespace", "value": {1: 2}}, "attribute name 1"),
    "namespace-dunder": ({T: "argparse.Namespace", "value": {"__class__": 1}}, "'__class__'"),
    "namespace-list": ({T: "argparse.Namespace", "value": [1, 2]}, "holds a list"),
    "attributedict-list": ({T: "AttributeDict", "value": [[1, 2, 3]]}, "holds a list"),
    "attributedict-int": ({T: "AttributeDict", "value": 5}, "holds a int"),
    "attributedict-str": ({T: "AttributeDict", "value": "abc"}, "holds a str"),
    "dictconfig-int": ({T: "omegaconf.DictConfig", "value": 5}, "holds a int"),
    "dictconfig-bad-interpolation": ({T: "omegaconf.DictConfig", "value": {"a": "${"}}, "GrammarParseError"),
    "listconfig-str": ({T: "omegaconf.ListConfig", "value": "a: 1"}, "holds a str"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_tagged_value_is_one_typed_line_naming_version_and_entry(repo_path, name):
    if "config" in name:
        pytest.importorskip("omegaconf")
    value, needle = MALFORMED[name]
    v = deltackpt.save({"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"cfg": value}}, repo_path)
    with pytest.raises(CorruptObjectError) as err:
        DeltackptIO(repo_path).load_checkpoint(v.id)
    text = str(err.value)
    assert "\n" not in text and f"version {v.id[:10]}" in text and "hyper_parameters.cfg" in text, text
    assert needle in text, text


def test_tagged_values_as_deep_as_a_save_allows_load(repo_path):
    """from_plain keeps its own stack: hyper-parameters nested ~490 levels (lists, with a Namespace
    every 47 levels) come back whole."""
    import argparse
    cfg: object = 7
    for i in range(470):
        cfg = [cfg] if i % 47 else [{T: "argparse.Namespace", "value": {"inner": cfg}}]
    v = deltackpt.save({"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"cfg": cfg}}, repo_path)
    back = DeltackptIO(repo_path).load_checkpoint(v.id)["hyper_parameters"]["cfg"]
    lists = spaces = 0
    while not isinstance(back, int):
        if isinstance(back, argparse.Namespace):
            back, spaces = back.inner, spaces + 1
        else:
            back, lists = back[0], lists + 1
    assert (lists, spaces, back) == (470, 10, 7)

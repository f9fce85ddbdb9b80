"""Framework checkpoints as plain data: what a Lightning checkpoint holds besides tensors, stored
without pickle, and rebuilt at load only from an allow-list in this module.

:func:`to_plain` copies a checkpoint into values deltackpt stores natively (tensors, dicts, lists,
tuples, numbers, strings, bytes, None):

- stored as they are: those plain values (``OrderedDict`` and other mappings become dicts);
- converted, listed in ``converted``, not rebuilt: numpy arrays (-> tensors), numpy scalars
  (-> numbers), ``pathlib`` paths, ``torch.dtype`` and ``torch.device`` (-> strings), namedtuples
  and list/tuple subclasses (-> lists/tuples);
- config objects, tagged: a dict ``{"__deltackpt_type__": TAG, "value": PLAIN, "class": NAME}``
  holding the object's contents as plain data and its type's qualified name:

  ============================  =========================  =======================================
  object                        stored ``value``           rebuilt by :func:`from_plain` as
  ============================  =========================  =======================================
  OmegaConf DictConfig/ListCfg  ``to_container(resolve=``  the same config (``OmegaConf.create``;
                                ``False)``: interpolations   a plain dict/list if omegaconf is not
                                kept as written            installed)
  ``argparse.Namespace``        its attributes (a dict)    ``argparse.Namespace``
  Lightning ``AttributeDict``   its items (a dict)         ``AttributeDict``
  a dataclass instance          its fields (a dict)        a plain dict (the class is not imported)
  an ``enum.Enum`` member       its value                  its value (the enum is not imported)
  a class (``hparams_type``)    its qualified name         the class if on the allow-list below,
                                                           else the name as a string
  ============================  =========================  =======================================

Nothing named in a repository is ever imported: the allow-list maps names to constructors this
module knows.  Anything else raises :class:`~deltackpt.UnsupportedLeafError` naming its key.

Example::

    state = to_plain({"hparams": Namespace(lr=0.1)})      # {"hparams": {"__deltackpt_type__": ...}}
    from_plain(state)["hparams"].lr                       # 0.1
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import pathlib
import sys
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch

from ..errors import CorruptObjectError, UnsupportedLeafError

TYPE_KEY = "__deltackpt_type__"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _omegaconf() -> Any:
    """The omegaconf module if installed (it is imported here, by a fixed name, never from a repository)."""
    try:
        import omegaconf
    except ImportError:
        return None
    return omegaconf


def _attribute_dict() -> type:
    """Lightning's AttributeDict (what ``LightningModule.hparams`` is), or Fabric's."""
    try:
        from pytorch_lightning.utilities.parsing import AttributeDict
    except ImportError:
        from lightning_fabric.utilities.data import AttributeDict as FabricAttributeDict
        return FabricAttributeDict
    return AttributeDict


def _is_attribute_dict(obj: Any) -> bool:
    mod = sys.modules.get("lightning_fabric.utilities.data")
    return mod is not None and isinstance(obj, mod.AttributeDict)


def _is_omegaconf(obj: Any) -> str | None:
    mod = sys.modules.get("omegaconf")
    if mod is None:
        return None
    if isinstance(obj, mod.DictConfig):
        return "omegaconf.DictConfig"
    if isinstance(obj, mod.ListConfig):
        return "omegaconf.ListConfig"
    return None


class _Malformed(Exception):
    """A tagged value whose stored form its rebuilder cannot take (the reason, for the caller's line)."""


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _rebuild_omegaconf(kind: type) -> Callable[[Any], Any]:
    def rebuild(value: Any) -> Any:
        if not isinstance(value, kind):   # OmegaConf.create would read a str as YAML, an int not at all
            raise _Malformed(f"holds a {type(value).__name__}, not a {kind.__name__}")
        oc = _omegaconf()
        return oc.OmegaConf.create(value) if oc is not None else value
    return rebuild


def _namespace(value: Any) -> argparse.Namespace:
    if not isinstance(value, dict):
        raise _Malformed(f"holds a {type(value).__name__}, not a map of attribute names")
    bad = next((k for k in value if not isinstance(k, str) or k.startswith("__")), None)
    if bad is not None:   # Namespace(**value) would refuse an int and set __class__ from a repository
        raise _Malformed(f"has the attribute name {bad!r:.40}")
    return argparse.Namespace(**value)


def _attributes(value: Any) -> Any:
    if not isinstance(value, dict):
        raise _Malformed(f"holds a {type(value).__name__}, not a map")
    return _attribute_dict()(value)


#: tag -> how a stored value is rebuilt (the whole allow-list of constructors)
_REBUILD: dict[str, Callable[[Any], Any]] = {
    "omegaconf.DictConfig": _rebuild_omegaconf(dict),
    "omegaconf.ListConfig": _rebuild_omegaconf(list),
    "argparse.Namespace": _namespace,
    "AttributeDict": _attributes,
    "dataclass": lambda v: v,
    "enum": lambda v: v,
}


def _rebuild(tag: str, value: Any, where: str) -> Any:
    """``value`` rebuilt as ``tag`` says; a stored form no rebuilder takes is one CorruptObjectError
    naming the entry (the repository is damaged or hostile: nothing of it runs)."""
    rebuild = _REBUILD.get(tag)
    if rebuild is None:
        return value
    try:
        return rebuild(value)
    except _Malformed as exc:
        raise CorruptObjectError(f"checkpoint entry {where}: the stored {tag} {exc}") from None
    except Exception as exc:  # noqa: BLE001 - OmegaConf's grammar and validation errors, a constructor's TypeError
        raise CorruptObjectError(f"checkpoint entry {where}: the stored {tag} cannot be rebuilt ({_one_line(exc)})") \
            from None


def _allowed_class(name: str) -> Any:
    """A class a checkpoint names (``hparams_type``), if it is one of these; else None."""
    if name == "argparse.Namespace":
        return argparse.Namespace
    if name in ("builtins.dict", "dict"):
        return dict
    if name in ("lightning_fabric.utilities.data.AttributeDict", "pytorch_lightning.utilities.parsing.AttributeDict"):
        return _attribute_dict()
    if name in ("omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig"):
        oc = _omegaconf()
        return None if oc is None else (oc.DictConfig if name.endswith("DictConfig") else oc.ListConfig)
    return None


def _tagged(tag: str, obj: Any, value: Any, path: str, converted: dict[str, str] | None) -> dict[str, Any]:
    if converted is not None:
        converted[path or "<root>"] = f"{_qualname(type(obj))}->{tag}"
    return {TYPE_KEY: tag, "class": _qualname(type(obj)), "value": to_plain(value, path, converted)}


def to_plain(obj: Any, path: str = "", converted: dict[str, str] | None = None) -> Any:
    """A copy of ``obj`` deltackpt can store without pickle; conversions are noted in ``converted``."""
    where = path or "<root>"
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        if isinstance(obj, enum.Enum):  # IntEnum, StrEnum: keep the member's class name
            return _tagged("enum", obj, obj.value, path, converted)
        return obj
    tag = _is_omegaconf(obj)
    if tag is not None:
        oc = sys.modules["omegaconf"]
        return _tagged(tag, obj, oc.OmegaConf.to_container(obj, resolve=False, enum_to_str=False), path, converted)
    if _is_attribute_dict(obj):
        return _tagged("AttributeDict", obj, dict(obj), path, converted)
    if isinstance(obj, Mapping):
        if TYPE_KEY in obj:
            raise UnsupportedLeafError(f"checkpoint entry {where}: the key {TYPE_KEY!r} is reserved for tagged values")
        if converted is not None and type(obj) is not dict:
            converted[where] = f"{type(obj).__name__}->dict"
        return {k: to_plain(v, f"{path}.{k}" if path else str(k), converted) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple, torch.Size):
        out = [to_plain(v, f"{path}.{i}" if path else str(i), converted) for i, v in enumerate(obj)]
        return out if type(obj) is list else tuple(out)
    if isinstance(obj, argparse.Namespace):
        return _tagged("argparse.Namespace", obj, vars(obj), path, converted)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _tagged("dataclass", obj, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, path,
                       converted)
    if isinstance(obj, enum.Enum):
        return _tagged("enum", obj, obj.value, path, converted)
    if isinstance(obj, type):
        if converted is not None:
            converted[where] = "class->name"
        return {TYPE_KEY: "class", "value": _qualname(obj)}
    note = None
    value: Any = None
    if isinstance(obj, np.ndarray):
        value, note = torch.from_numpy(np.ascontiguousarray(obj)), "ndarray->tensor"
    elif isinstance(obj, np.generic):
        value, note = obj.item(), f"{type(obj).__name__}->{type(obj.item()).__name__}"
    elif isinstance(obj, pathlib.PurePath):
        value, note = str(obj), "path->str"
    elif isinstance(obj, (torch.dtype, torch.device)):
        value, note = str(obj), f"{type(obj).__name__}->str"
    elif isinstance(obj, (list, tuple)):   # namedtuples and list subclasses
        value, note = to_plain(list(obj) if isinstance(obj, list) else tuple(obj), path, converted), \
            f"{type(obj).__name__}->{'list' if isinstance(obj, list) else 'tuple'}"
    else:
        raise UnsupportedLeafError(
            f"checkpoint entry {where}: {_qualname(type(obj))} cannot be stored without pickle; make it a plain "
            "value (e.g. save_hyperparameters(ignore=[...]) or a str)")
    if converted is not None:
        converted[where] = note
    return value


def from_plain(obj: Any) -> Any:
    """Rebuild the tagged values :func:`to_plain` wrote (allow-listed types only; see the module doc).
    A tagged value stored malformed raises CorruptObjectError naming its entry.  The walk keeps its
    own stack: any depth a save accepts loads."""
    end = object()
    root: list[Any] = [None]
    # (children as (key, value), the copy being filled, its parent, its slot there, a finisher, its path)
    stack: list[tuple[Any, Any, Any, Any, Any, str]] = []

    def place(value: Any, parent: Any, slot: Any, path: str) -> None:
        out: Any
        if isinstance(value, dict):
            tag = value.get(TYPE_KEY)
            if isinstance(tag, str) and "value" in value:
                if tag == "class":
                    name = value["value"]
                    cls = _allowed_class(name) if isinstance(name, str) else None
                    parent[slot] = cls if cls is not None else name
                    return
                holder = [None]   # the value's plain contents first, then the rebuild
                where = path or "<root>"
                stack.append((iter([(0, value["value"])]), holder, parent, slot,
                              lambda h, tag=tag, where=where: _rebuild(tag, h[0], where), path))
                return
            parent[slot] = out = {}
            stack.append((iter(value.items()), out, parent, slot, None, path))
        elif isinstance(value, (list, tuple)):
            parent[slot] = out = []
            stack.append((enumerate(value), out, parent, slot, tuple if isinstance(value, tuple) else None, path))
        else:
            parent[slot] = value

    place(obj, root, 0, "")
    while stack:
        children, out, parent, slot, finish, path = stack[-1]
        item: Any = next(children, end)
        if item is end:
            stack.pop()
            if finish is not None:
                parent[slot] = finish(out)
            continue
        key, value = item
        if isinstance(out, list) and key == len(out):
            out.append(None)
        elif isinstance(out, dict):
            out[key] = None
        place(value, out, key, f"{path}.{key}" if path else str(key))
    return root[0]

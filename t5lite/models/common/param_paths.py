"""Parameter trees as flat maps of '/'-joined paths, and back:

    flatten({"encoder": {"layers_0": {"mlp": {"wo": {"kernel": x}}}}})
        == {"encoder/layers_0/mlp/wo/kernel": x}

A leaf is anything that is not a Mapping (arrays, ShapeDtypeStructs, PartitionSpecs).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def unflatten(flat: Mapping[str, Any]) -> Dict[str, Any]:
    tree: Dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return tree

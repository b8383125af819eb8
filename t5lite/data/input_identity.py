"""What a task's token stream is made of, fingerprinted, so that a resumed run can tell
whether it still reads the same: the vocabulary (its file's bytes, a SentencePiece
model's or a tokenizer.json's, and extra ids) and the split's data files (each file's
size and fingerprint).

    now = stream_inputs(provider, "train")
    # {"vocabulary": {"path": ..., "sha256": ..., "extra_ids": 100},
    #  "files": {path: [size, fingerprint], ...}}
    difference(saved, now)   # None, or one clause naming both sides

A data iterator saves `stream_inputs` with its position (t5lite/data/pipeline.py); a
resume that finds a difference refuses, unless the run allows changed inputs on purpose
(ALLOW_CHANGED_INPUTS=True). Cost: the vocabulary file read once (about 1 MB) and the
first and last 64 kB of each data file, once per run.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List, Mapping, Optional

from t5lite.data.files.positions import file_identity
from t5lite.data.tf_env import import_tensorflow

tf = import_tensorflow()
import seqio  # noqa: E402


def _vocabulary(vocab) -> Optional[Dict[str, Any]]:
    path = (getattr(vocab, "vocabulary_file", None)
            or getattr(vocab, "sentencepiece_model_file", None))
    if path is None:
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"path": str(path), "sha256": digest, "extra_ids": int(getattr(vocab, "extra_ids", 0))}


def _tasks(provider) -> List[seqio.Task]:
    if isinstance(provider, seqio.Mixture):
        return list(provider.tasks)
    return [provider]


def _files(provider, split: str) -> Dict[str, List[int]]:
    out: Dict[str, List[int]] = {}
    for task in _tasks(provider):
        source = getattr(task, "source", None)
        if source is None or split not in getattr(source, "splits", (split,)):
            continue
        for path in source.list_shards(split):
            path = str(path)
            if os.path.isfile(path):
                out[path] = list(file_identity(path))
    return out


def stream_inputs(provider, split: str) -> Dict[str, Any]:
    """{"vocabulary": the targets vocabulary's file and hash (None for one without a
    file), "files": {path: [size, fingerprint]} of the split's local data files}."""
    vocab = provider.output_features["targets"].vocabulary
    return {"vocabulary": _vocabulary(vocab), "files": _files(provider, split)}


def _short(vocabulary: Optional[Mapping[str, Any]]) -> str:
    if not vocabulary:
        return "none"
    return (f"{vocabulary.get('path')} (sha256 {str(vocabulary.get('sha256'))[:12]}, "
            f"{vocabulary.get('extra_ids')} extra ids)")


def difference(saved: Mapping[str, Any], now: Mapping[str, Any]) -> Optional[str]:
    """None when `now` reads what `saved` did; else one clause naming both sides (the
    vocabulary first, then the data files: changed, added, removed)."""
    old_vocab, new_vocab = saved.get("vocabulary"), now.get("vocabulary")
    if (old_vocab or {}).get("sha256") != (new_vocab or {}).get("sha256") or \
            (old_vocab or {}).get("extra_ids") != (new_vocab or {}).get("extra_ids"):
        return (f"the vocabulary is {_short(new_vocab)}, but the checkpoint was trained with "
                f"{_short(old_vocab)}")
    old_files, new_files = dict(saved.get("files") or {}), dict(now.get("files") or {})
    changed = [p for p in new_files if p in old_files and list(old_files[p]) != new_files[p]]
    added = [p for p in new_files if p not in old_files]
    removed = [p for p in old_files if p not in new_files]
    if not (changed or added or removed):
        return None
    parts = []
    if changed:
        p = changed[0]
        parts.append(f"{len(changed)} changed ({p}: {old_files[p][0]} bytes then, "
                     f"{new_files[p][0]} now)")
    if added:
        parts.append(f"{len(added)} added ({added[0]})")
    if removed:
        parts.append(f"{len(removed)} gone ({removed[0]})")
    return ("the task's data files are not the ones the checkpoint was trained on: "
            + ", ".join(parts))

"""Input-pipeline throughput: t5lite's span-corruption pipeline against plain SeqIO with
T5's own preprocessors, on the same documents and vocabulary, in one process.

    ours   edge.make_iterator("pile_span_corruption"): the Pile reader (jsonl, a
           Python generator inside tf.data) -> T5's span corruption -> seqio's feature
           converter -> batches
    seqio  a seqio.Task over seqio.TextLineDataSource (the same documents, one a line)
           with the same preprocessors (rekey, tokenize, span_corruption,
           append_eos_after_trim), converter and batching: what a T5X user runs

Each is read for a number of batches after a warm-up; wall time and the CPU time of the
whole process (user + system, every thread: `resource.getrusage`) give examples per
second and examples per busy-core second (the figure that says how many cores a host
needs to feed its GPUs).
"""
from __future__ import annotations

import functools
import json
import os
import random
import resource
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

from t5lite.data import edge

tf = edge.import_tensorflow()
tasks = edge.import_tasks()
import seqio  # noqa: E402
from t5.data import preprocessors as t5_preprocessors  # noqa: E402

PLAIN_TASK = "t5lite_throughput_plain_seqio_span_corruption"


def write_corpus(directory: str, documents: int, seed: int = 0,
                 mean_chars: Optional[int] = None, compress: bool = False) -> Dict[str, str]:
    """The same documents as a Pile-style jsonl (train/00.jsonl, or .jsonl.zst written as
    one zstd frame like the Pile's) and as plain text (one document a line):
    {"pile_dir": ..., "text_file": ..., "pile_file": ...}. `mean_chars`: join generated
    documents into ones of that mean length (exponentially distributed, like the Pile's
    long tail); default the generator's own short documents."""
    docs = [" ".join(d["text"].split()) for d in edge.demo_corpus.pile_documents(documents, seed)]
    if mean_chars:
        docs = _joined(docs, documents, mean_chars, seed)
    os.makedirs(os.path.join(directory, "pile", "train"), exist_ok=True)
    data = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    pile_file = os.path.join(directory, "pile", "train",
                             "00.jsonl.zst" if compress else "00.jsonl")
    if compress:
        import zstandard
        data = zstandard.ZstdCompressor(level=3).compress(data)
    with open(pile_file, "wb") as f:
        f.write(data)
    text_file = os.path.join(directory, "documents.txt")
    with open(text_file, "w") as f:
        f.writelines(d + "\n" for d in docs)
    return {"pile_dir": os.path.join(directory, "pile"), "text_file": text_file,
            "pile_file": pile_file}


def use_corpus(corpus: Mapping[str, str], vocabulary_path: str) -> None:
    """Register the tasks over `corpus` (from `write_corpus`) and `vocabulary_path`."""
    edge.import_tasks(edge.DataSettings(pile_dir=corpus["pile_dir"],
                                        vocabulary_path=vocabulary_path))


def _joined(docs: List[str], n: int, mean_chars: int, seed: int) -> List[str]:
    rng, out, i = random.Random(seed), [], 0
    for _ in range(n):
        want, parts, size = rng.expovariate(1 / mean_chars), [], 0
        while size < want or not parts:
            parts.append(docs[i % len(docs)])
            size += len(parts[-1]) + 1
            i += 1
        out.append(" ".join(parts))
    return out


def _lines_to_text(ds):
    """TextLineDataSource yields lines; T5's text tasks start from {"text": line}."""
    return ds.map(lambda line: {"text": line}, num_parallel_calls=tf.data.AUTOTUNE)


def register_plain_task(text_file: str, vocabulary_path: str) -> str:
    """A seqio Task as T5's own span-corruption tasks are built, over `text_file`."""
    vocab = seqio.SentencePieceVocabulary(vocabulary_path, extra_ids=100)
    if PLAIN_TASK in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(PLAIN_TASK)
    seqio.TaskRegistry.add(
        PLAIN_TASK, source=seqio.TextLineDataSource({"train": text_file}),
        preprocessors=[
            _lines_to_text,
            functools.partial(t5_preprocessors.rekey,
                              key_map={"inputs": None, "targets": "text"}),
            seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
            functools.partial(t5_preprocessors.span_corruption,
                              noise_density=tasks.NOISE_DENSITY,
                              mean_noise_span_length=tasks.MEAN_NOISE_SPAN_LENGTH),
            seqio.preprocessors.append_eos_after_trim],
        output_features={
            "inputs": seqio.Feature(vocabulary=vocab, add_eos=True, required=False),
            "targets": seqio.Feature(vocabulary=vocab, add_eos=True)},
        metric_fns=[])
    return PLAIN_TASK


def plain_batches(lengths: Mapping[str, int], batch_size: int, pack: bool,
                  seed: int = 0) -> Iterator[Dict[str, Any]]:
    """Batches of the plain seqio task (repeated, shuffled like ours)."""
    ds = seqio.get_mixture_or_task(PLAIN_TASK).get_dataset(
        dict(lengths), split="train", shuffle=True, seed=seed, num_epochs=None)
    ds = seqio.EncDecFeatureConverter(pack=pack)(ds, dict(lengths))
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(2)
    return ds.as_numpy_iterator()


def our_batches(lengths: Mapping[str, int], batch_size: int, pack: bool,
                seed: int = 0) -> Iterator[Dict[str, Any]]:
    return edge.make_iterator("pile_span_corruption", split="train",
                              feature_lengths=dict(lengths),
                              layout=edge.DataLayout(batch_size), pack=pack, shuffle=True,
                              seed=seed)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(batches: Callable[[], Iterator[Dict[str, Any]]], n_batches: int,
            warmup: int = 2) -> Dict[str, float]:
    """Examples read in `n_batches` after `warmup`: rows, or in packed rows the examples
    packed into them (their segments)."""
    iterator = batches()
    for _ in range(warmup):
        next(iterator)
    wall, cpu, examples = time.perf_counter(), cpu_seconds(), 0
    for _ in range(n_batches):
        batch = next(iterator)
        segments = batch.get("decoder_segment_ids")
        examples += (int(segments.max(axis=1).sum()) if segments is not None
                     else len(batch["decoder_target_tokens"]))
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return {"examples": examples, "wall_s": wall, "cpu_s": cpu,
            "examples_per_s": examples / wall, "examples_per_core_s": examples / cpu,
            "busy_cores": cpu / wall}


def compare(lengths_list: List[Mapping[str, int]], packs=(False, True), batch_size: int = 64,
            n_batches: int = 20) -> List[Dict[str, Any]]:
    """Both pipelines for every (lengths, pack); the plain task must be registered and
    the data settings (PILE_DIR, VOCABULARY_PATH) applied."""
    rows = []
    for lengths in lengths_list:
        for pack in packs:
            for name, fn in (("t5lite", our_batches), ("plain seqio", plain_batches)):
                result = measure(lambda: fn(lengths, batch_size, pack), n_batches)
                rows.append({"pipeline": name, "inputs": lengths["inputs"],
                             "targets": lengths["targets"], "pack": pack,
                             "batch_size": batch_size, **result})
    return rows


def format_table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| pipeline | inputs / targets | packed | examples/s | busy cores | "
             "examples / core-s |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['pipeline']} | {r['inputs']} / {r['targets']} | "
                     f"{'yes' if r['pack'] else 'no'} | {r['examples_per_s']:,.0f} | "
                     f"{r['busy_cores']:.2f} | {r['examples_per_core_s']:,.0f} |")
    return "\n".join(lines)


def resume_cost(lengths: Mapping[str, int], rows: int, pile_file: str, early: int = 2,
                late: int = 40, pack: bool = False) -> Dict[str, Any]:
    """What a resume of our iterator costs at batch `early` and at batch `late` (rows
    per process, the default shuffle buffer): the saved state's size, the time to save
    it, the time from restoring it to the first batch, and the records the reader parses
    meanwhile; beside them the time per batch (what a replay would pay per batch
    skipped) and the zstd decompression rate of seeking in the one-frame `pile_file`
    (what reopening a Pile shard mid-file costs per byte before the position)."""
    jsonl_cursor = edge.jsonl_cursor

    def make():
        return edge.make_iterator("pile_span_corruption", split="train",
                                  feature_lengths=dict(lengths), layout=edge.DataLayout(rows),
                                  pack=pack, shuffle=True, seed=0)
    iterator, states, t0 = make(), {}, time.perf_counter()
    next(iterator)
    t1 = time.perf_counter()
    for position in range(2, late + 1):
        next(iterator)
        if position in (early, late):
            t = time.perf_counter()
            state = iterator.get_state()
            states[position] = (state, time.perf_counter() - t)
    per_batch = (time.perf_counter() - t1) / (late - 1)
    out: Dict[str, Any] = {"rows": rows, "inputs": lengths["inputs"],
                           "targets": lengths["targets"], "pack": pack,
                           "first_batch_fresh_s": t1 - t0, "s_per_batch": per_batch}
    for position, (state, save_s) in states.items():
        parsed = jsonl_cursor.STATS["records_parsed"]
        t = time.perf_counter()
        resumed = make()
        resumed.set_state(state)
        next(resumed)
        out[f"batch_{position}"] = {
            "state_bytes": sum(len(b) for b in state["iterator"]["states"].values()),
            "save_s": save_s,
            "restore_to_first_batch_s": time.perf_counter() - t,
            "records_parsed": jsonl_cursor.STATS["records_parsed"] - parsed}
    # seeking: a fresh reader at the end of the one-frame file decompresses all before it
    pool, position, last = jsonl_cursor.CursorPool(), jsonl_cursor.START, None
    while True:
        texts, after = pool.read(pile_file, position, 16)
        if not texts:
            break
        last, position = position, after  # `last`: the start of the file's last texts
    skipped, t = jsonl_cursor.STATS["bytes_skipped"], time.perf_counter()
    for _ in range(5):
        jsonl_cursor.CursorPool().read(pile_file, last, 1)
    seconds = (time.perf_counter() - t) / 5
    out["zstd_seek_bytes"] = (jsonl_cursor.STATS["bytes_skipped"] - skipped) // 5
    out["zstd_seek_bytes_per_s"] = out["zstd_seek_bytes"] / seconds
    return out

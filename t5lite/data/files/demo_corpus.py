"""A small made-up corpus in the real file formats, for demos and tests (no downloads).
`write_all` (and `ensure`, which writes it once, atomically; the command is
`python -m t5lite.demo_data`) writes, under the output directory,

    pile/train/00.jsonl.zst, 01.jsonl.zst, pile/val.jsonl.zst, pile/test.jsonl.zst
                                the Pile's layout: {"text": ..., "meta": {...}} a line
    multinli_1.0/multinli_1.0_{train,dev_matched,dev_mismatched}.jsonl    MultiNLI
    glue/MNLI/{train,dev_matched,dev_mismatched}.tsv                      GLUE MNLI
    squad/{train,dev}-v1.1.json                                           SQuAD v1.1
    lambada/lambada_test.jsonl   Lambada as OpenAI ships it: {"text": ...} a line
    boolq/dev.jsonl              BoolQ: {"question", "title", "answer", "passage"} a line
    spm.model                   a SentencePiece vocabulary trained on the Pile part

and `paths` says where each data setting points. The text is simple
generated English (a few hundred words, fixed grammar): a model learns it quickly, which
makes loss curves of demo runs meaningful. Everything is a function of the seed.
"""
from __future__ import annotations

import json
import os
import random
from typing import Dict, List, Optional, Sequence, Tuple

from t5lite.data.files.readers import MNLI_LABELS

_NAMES = ("Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John",
          "Margaret", "Ken", "Radia", "Niklaus", "Sophie", "Tim", "Hedy", "Claude")
_ROLES = ("engineer", "teacher", "farmer", "painter", "doctor", "pilot", "baker",
          "sailor", "writer", "gardener", "student", "musician", "chemist", "mayor")
_ADJECTIVES = ("small", "large", "red", "green", "quiet", "busy", "old", "new", "bright",
               "heavy", "warm", "cold", "young", "clever", "happy", "tired", "famous")
_OBJECTS = ("book", "garden", "bridge", "boat", "letter", "machine", "house", "song",
            "painting", "river", "market", "lamp", "table", "window", "bicycle", "map",
            "violin", "kitchen", "tower", "orchard")
_VERBS = (("build", "builds", "built"), ("paint", "paints", "painted"),
          ("repair", "repairs", "repaired"), ("sell", "sells", "sold"),
          ("find", "finds", "found"), ("clean", "cleans", "cleaned"),
          ("visit", "visits", "visited"), ("draw", "draws", "drew"),
          ("open", "opens", "opened"), ("carry", "carries", "carried"),
          ("study", "studies", "studied"), ("describe", "describes", "described"))
_PLACES = ("in the village", "near the harbour", "at the station", "in the old town",
           "by the lake", "on the hill", "in the capital", "at the university",
           "behind the museum", "across the valley")
_TIMES = ("every morning", "on Sundays", "in the spring", "after lunch", "at night",
          "before the storm", "during the festival", "last winter")
_TOPICS = ("Pile-CC", "Wikipedia (en)", "Books3", "ArXiv", "Github", "StackExchange")
_GENRES = ("fiction", "government", "slate", "telephone", "travel")


class _Writer:
    """Sentences and facts from one seeded random stream."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def pick(self, seq):
        return self.rng.choice(seq)

    def fact(self) -> Dict[str, str]:
        verb = self.pick(_VERBS)
        return {"name": self.pick(_NAMES), "role": self.pick(_ROLES),
                "adj": self.pick(_ADJECTIVES), "obj": self.pick(_OBJECTS),
                "base": verb[0], "verb": verb[1], "past": verb[2],
                "place": self.pick(_PLACES), "time": self.pick(_TIMES)}

    def sentence(self, f: Optional[Dict[str, str]] = None) -> str:
        f = f or self.fact()
        form = self.rng.randrange(5)
        if form == 0:
            return (f"{f['name']} the {f['role']} {f['verb']} a {f['adj']} {f['obj']} "
                    f"{f['place']}.")
        if form == 1:
            return (f"{f['time'].capitalize()}, the {f['role']} {f['past']} the {f['obj']} "
                    f"{f['place']}.")
        if form == 2:
            return f"The {f['adj']} {f['obj']} was {f['past']} by {f['name']} {f['time']}."
        if form == 3:
            return (f"{f['name']} {f['past']} a {f['adj']} {f['obj']}, and the {f['role']} "
                    f"was {self.pick(_ADJECTIVES)}.")
        return (f"In {self.rng.randint(1800, 2024)}, {f['name']} {f['past']} "
                f"{self.rng.randint(2, 999)} {f['obj']}s {f['place']}.")

    def paragraph(self, n: int) -> str:
        return " ".join(self.sentence() for _ in range(n))

    def document(self) -> str:
        paragraphs = [self.paragraph(self.rng.randint(2, 8))
                      for _ in range(self.rng.randint(1, 4))]
        return "\n\n".join(paragraphs)


# -- the Pile ----------------------------------------------------------------------------
def _write_jsonl(path: str, records: Sequence[dict], compress: bool) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")
    if compress:
        import zstandard
        data = zstandard.ZstdCompressor(level=3).compress(data)
    with open(path, "wb") as f:
        f.write(data)
    return path


def pile_documents(n: int, seed: int = 0) -> List[dict]:
    w = _Writer(seed)
    return [{"text": w.document(), "meta": {"pile_set_name": w.pick(_TOPICS)}}
            for _ in range(n)]


def write_pile(directory: str, *, train_files: int = 2, docs_per_file: int = 50,
               eval_docs: int = 20, compress: bool = True, seed: int = 0) -> Dict[str, List[str]]:
    """The Pile's layout: train/NN.jsonl[.zst], val.jsonl[.zst], test.jsonl[.zst].
    Returns {split: [files]}."""
    ext = ".jsonl.zst" if compress else ".jsonl"
    out: Dict[str, List[str]] = {"train": [], "validation": [], "test": []}
    for i in range(train_files):
        out["train"].append(_write_jsonl(os.path.join(directory, "train", f"{i:02d}{ext}"),
                                         pile_documents(docs_per_file, seed * 1000 + i),
                                         compress))
    out["validation"].append(_write_jsonl(os.path.join(directory, "val" + ext),
                                          pile_documents(eval_docs, seed * 1000 + 900),
                                          compress))
    out["test"].append(_write_jsonl(os.path.join(directory, "test" + ext),
                                    pile_documents(eval_docs, seed * 1000 + 901), compress))
    return out


def write_text(path: str, lines: int = 1000, seed: int = 0) -> str:
    """Plain text, one paragraph a line."""
    w = _Writer(seed)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            f.write(w.paragraph(w.rng.randint(1, 4)) + "\n")
    return path


# -- MNLI --------------------------------------------------------------------------------
def mnli_pairs(n: int, seed: int = 0) -> List[Tuple[str, str, str, str]]:
    """(premise, hypothesis, gold_label, genre). The premise says that someone did
    something; a hypothesis about the same person restating it is entailment, denying it
    contradiction, adding a time neutral, and one about somebody else (either form) is
    neutral too: the hypothesis alone does not give the label, the names must be compared."""
    w = _Writer(seed)
    out = []
    for i in range(n):
        f = w.fact()
        premise = f"{f['name']} the {f['role']} {f['past']} a {f['adj']} {f['obj']} {f['place']}."
        label = MNLI_LABELS[i % 3]
        name = f["name"]
        other = w.pick([x for x in _NAMES if x != name])
        if label == "entailment":
            hypothesis = f"{name} {f['past']} a {f['obj']}."
        elif label == "contradiction":
            hypothesis = f"{name} never {f['past']} any {f['obj']}."
        else:
            form = w.rng.randrange(3)
            if form == 0:
                hypothesis = f"{name} {f['past']} the {f['obj']} {f['time']}."
            elif form == 1:
                hypothesis = f"{other} {f['past']} a {f['obj']}."
            else:
                hypothesis = f"{other} never {f['past']} any {f['obj']}."
        out.append((premise, hypothesis, label, w.pick(_GENRES)))
    return out


_MNLI_SPLITS = (("train", "train"), ("dev_matched", "validation_matched"),
                ("dev_mismatched", "validation_mismatched"))


def write_multinli(directory: str, *, train: int = 60, dev: int = 15, seed: int = 0,
                   unlabeled_every: int = 0) -> Dict[str, str]:
    """MultiNLI 1.0 jsonl files; every `unlabeled_every`-th dev record gets gold_label
    "-" (no consensus), as in the real dev sets. Returns {split: path}."""
    out = {}
    for k, (name, split) in enumerate(_MNLI_SPLITS):
        records = []
        for i, (p, h, label, genre) in enumerate(mnli_pairs(train if k == 0 else dev,
                                                            seed * 10 + k)):
            gold = "-" if (k and unlabeled_every and i % unlabeled_every == 0) else label
            records.append({"annotator_labels": [label], "genre": genre, "gold_label": gold,
                            "pairID": f"{k}{i:05d}e", "promptID": f"{k}{i:05d}",
                            "sentence1": p, "sentence1_binary_parse": "( x )",
                            "sentence1_parse": "(ROOT x)", "sentence2": h,
                            "sentence2_binary_parse": "( y )", "sentence2_parse": "(ROOT y)"})
        out[split] = _write_jsonl(os.path.join(directory, f"multinli_1.0_{name}.jsonl"),
                                  records, compress=False)
    return out


def write_glue_mnli(directory: str, *, train: int = 60, dev: int = 15,
                    seed: int = 0) -> Dict[str, str]:
    """GLUE's MNLI TSVs (header line, tab-separated, no quoting). Returns {split: path}."""
    out = {}
    os.makedirs(directory, exist_ok=True)
    for k, (name, split) in enumerate(_MNLI_SPLITS):
        labels = ["label1"] if k == 0 else [f"label{j}" for j in range(1, 6)]
        header = (["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                   "sentence2_binary_parse", "sentence1_parse", "sentence2_parse",
                   "sentence1", "sentence2"] + labels + ["gold_label"])
        path = os.path.join(directory, f"{name}.tsv")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\t".join(header) + "\n")
            for i, (p, h, label, genre) in enumerate(mnli_pairs(train if k == 0 else dev,
                                                                seed * 10 + k)):
                row = ([str(i), f"{k}{i:05d}", f"{k}{i:05d}e", genre, "( x )", "( y )",
                        "(ROOT x)", "(ROOT y)", p, h] + [label] * len(labels) + [label])
                f.write("\t".join(row) + "\n")
        out[split] = path
    return out


# -- SQuAD -------------------------------------------------------------------------------
def squad_articles(n_articles: int, questions_per_article: int = 3, seed: int = 0,
                   extra_answers: bool = False) -> List[dict]:
    """SQuAD v1.1 "data" entries whose answers are spans of their contexts."""
    w = _Writer(seed)
    data = []
    for a in range(n_articles):
        facts = [w.fact() for _ in range(questions_per_article)]
        sentences = [f"{f['name']} the {f['role']} {f['verb']} a {f['adj']} {f['obj']} "
                     f"{f['place']}." for f in facts]
        context = " ".join(sentences)
        qas = []
        for q, f in enumerate(facts):
            start = context.index(sentences[q]) + len(f"{f['name']} the {f['role']} "
                                                      f"{f['verb']} a ")
            answer = f"{f['adj']} {f['obj']}"
            assert context[start:start + len(answer)] == answer
            answers = [{"text": answer, "answer_start": start}]
            if extra_answers:  # dev sets hold several annotators' answers
                obj_start = start + len(f["adj"]) + 1
                answers += [{"text": f["obj"], "answer_start": obj_start},
                            {"text": f"a {answer}", "answer_start": start - 2}]
            qas.append({"id": f"{a:04d}{q:02d}", "answers": answers,
                        "question": f"What does {f['name']} the {f['role']} {f['base']}?"})
        data.append({"title": f"Article_{a}", "paragraphs": [{"context": context, "qas": qas}]})
    return data


def write_squad(directory: str, *, train_articles: int = 10, dev_articles: int = 4,
                seed: int = 0) -> Dict[str, str]:
    """train-v1.1.json and dev-v1.1.json. Returns {split: path}."""
    os.makedirs(directory, exist_ok=True)
    out = {}
    for name, split, n, extra in (("train", "train", train_articles, False),
                                  ("dev", "validation", dev_articles, True)):
        path = os.path.join(directory, f"{name}-v1.1.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"version": "1.1",
                       "data": squad_articles(n, seed=seed * 10 + len(out),
                                              extra_answers=extra)}, f)
        out[split] = path
    return out


# -- the zero-shot sets: Lambada, BoolQ ----------------------------------------------------
def lambada_passages(n: int, seed: int = 0) -> List[str]:
    """Passages whose last word (a name or a thing named earlier, no final period) the
    context gives away, as Lambada's do."""
    w = _Writer(seed)
    out = []
    for i in range(n):
        f = w.fact()
        end = (f"Later, the {f['role']} who {f['past']} the {f['obj']} was {f['name']}"
               if i % 2 == 0 else f"{f['time'].capitalize()}, {f['name']} came back to look "
                                  f"at the {f['adj']} {f['obj']}")
        out.append(f"{f['name']} the {f['role']} {f['past']} a {f['adj']} {f['obj']} "
                   f"{f['place']}. {w.paragraph(w.rng.randint(1, 2))} {end}")
    return out


def write_lambada(directory: str, *, n: int = 100, seed: int = 0) -> str:
    """lambada_test.jsonl in OpenAI's layout. Returns its path."""
    return _write_jsonl(os.path.join(directory, "lambada_test.jsonl"),
                        [{"text": t} for t in lambada_passages(n, seed)], compress=False)


def boolq_records(n: int, seed: int = 0) -> List[dict]:
    """BoolQ records: a passage stating a fact, a lowercase question without "?" (as
    BoolQ's) asking it back true (even records) or with another name or thing (odd)."""
    w = _Writer(seed)
    out = []
    for i in range(n):
        f = w.fact()
        passage = (f"{f['name']} the {f['role']} {f['past']} a {f['adj']} {f['obj']} "
                   f"{f['place']}. {w.sentence()}")
        name, obj = f["name"], f["obj"]
        if i % 2:
            if w.rng.randrange(2):
                name = w.pick([x for x in _NAMES if x != name])
            else:
                obj = w.pick([x for x in _OBJECTS if x != obj])
        out.append({"question": f"did {name} {f['base']} a {obj}".lower(), "title": f["obj"],
                    "answer": i % 2 == 0, "passage": passage})
    return out


def write_boolq(directory: str, *, n: int = 100, seed: int = 0) -> str:
    """dev.jsonl in BoolQ's layout. Returns its path."""
    return _write_jsonl(os.path.join(directory, "dev.jsonl"), boolq_records(n, seed),
                        compress=False)


_ZERO_SHOT = {"lambada_dir": write_lambada, "boolq_dir": write_boolq}


def _ensure_zero_shot(output_dir: str, seed: int) -> None:
    """The zero-shot sets of a corpus written before they were part of it (each into a
    temporary directory, then renamed: concurrent callers agree)."""
    import shutil
    import tempfile
    for name, path in paths(output_dir).items():
        if name in _ZERO_SHOT and not os.path.isdir(path):
            tmp = tempfile.mkdtemp(prefix=".tmp-", dir=output_dir)
            try:
                _ZERO_SHOT[name](tmp, seed=seed)
                os.rename(tmp, path)
            except OSError:  # another process finished first
                if not os.path.isdir(path):
                    raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


# -- everything --------------------------------------------------------------------------
COMPLETE_MARKER = "COMPLETE"


def paths(output_dir: str) -> Dict[str, str]:
    """{data setting: path} of a corpus written by `write_all` (t5lite/data/settings.py)."""
    return {"vocabulary_path": os.path.join(output_dir, "spm.model"),
            "pile_dir": os.path.join(output_dir, "pile"),
            "mnli_dir": os.path.join(output_dir, "multinli_1.0"),
            "squad_dir": os.path.join(output_dir, "squad"),
            "lambada_dir": os.path.join(output_dir, "lambada"),
            "boolq_dir": os.path.join(output_dir, "boolq")}


def write_all(output_dir: str, *, vocab_size: int = 400, seed: int = 0,
              docs_per_file: int = 200) -> Dict[str, str]:
    """Every format above plus a vocabulary; returns {data setting: path}."""
    from t5lite.data.files import vocab_training

    where = paths(output_dir)
    pile = write_pile(where["pile_dir"], docs_per_file=docs_per_file, seed=seed)
    write_multinli(where["mnli_dir"], train=3000, dev=150, seed=seed)
    write_glue_mnli(os.path.join(output_dir, "glue", "MNLI"), train=600, dev=150, seed=seed)
    write_squad(where["squad_dir"], train_articles=100, dev_articles=20, seed=seed)
    for name, write in _ZERO_SHOT.items():
        write(where[name], seed=seed)
    vocab_training.train_vocabulary(pile["train"], where["vocabulary_path"], vocab_size,
                                    seed=seed, hard_vocab_limit=False)
    return where


def ensure(output_dir: str, **kwargs) -> Dict[str, str]:
    """The corpus under `output_dir`, written first if it is not complete there (into a
    temporary sibling directory, then renamed: an interrupted write leaves nothing half
    done, and concurrent callers agree). Returns {data setting: path}; kwargs go to
    `write_all`."""
    output_dir = os.path.abspath(os.path.expanduser(output_dir))
    if os.path.exists(os.path.join(output_dir, COMPLETE_MARKER)):
        _ensure_zero_shot(output_dir, kwargs.get("seed", 0))  # a corpus written before them
        return paths(output_dir)
    if os.path.exists(output_dir) and os.listdir(output_dir):
        from t5lite.errors import DataError
        raise DataError(f"the demo data directory {output_dir} exists but holds no complete "
                        f"demo corpus (no {COMPLETE_MARKER} file); remove it or choose "
                        f"another DEMO_DATA_DIR")
    import logging
    import shutil
    import tempfile
    logging.getLogger(__name__).info("writing the demo corpus and training its vocabulary "
                                     "in %s (first use only)", output_dir)
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(output_dir) + ".tmp-", dir=parent)
    try:
        write_all(tmp, **kwargs)
        with open(os.path.join(tmp, COMPLETE_MARKER), "w") as f:
            f.write("written by t5lite.data.files.demo_corpus\n")
        if os.path.isdir(output_dir) and not os.listdir(output_dir):
            os.rmdir(output_dir)
        try:
            os.rename(tmp, output_dir)
        except OSError:  # another process finished first
            if not os.path.exists(os.path.join(output_dir, COMPLETE_MARKER)):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return paths(output_dir)

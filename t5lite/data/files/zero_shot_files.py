"""The zero-shot sets' raw files, in plain Python (no TensorFlow): Lambada and BoolQ as
their releases lay them out, each example read into what the evaluation scores
(`t5lite.inference.zero_shot`).

    Lambada   lambada_test.jsonl (OpenAI's, what lm-evaluation-harness's lambada_openai
              reads): one {"text": passage} a line; or plain text, one passage a line
              (the original release's lambada_test_plain_text.txt)
    BoolQ     dev.jsonl (the official release; SuperGLUE's is val.jsonl): one
              {"question", "passage", "answer": true/false, "title"} a line
              (SuperGLUE's files name the answer "label")

A passage's last word is what follows its last whitespace (the harness splits on the
last space): the context is the text before that whitespace, the target " " + the word.
BoolQ's prompt is the harness's, "{passage}\\nQuestion: {question}?\\nAnswer:", its
choices " no" and " yes". Blank lines are skipped; any other line that does not hold an
example (not JSON, a field missing, a passage with no last word, an answer that is not
a JSON boolean) is one DataFormatError naming the file and line.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
from typing import Iterator, List, Sequence, Tuple

from t5lite.errors import DataFormatError, DataNotFoundError

LAMBADA_FILES = ("lambada_test.jsonl", "lambada_test_plain_text.txt")
BOOLQ_FILES = ("dev.jsonl", "val.jsonl")
BOOLQ_CHOICES = (" no", " yes")  # the harness's order: a tie picks " no"
_LAST_WORD = re.compile(r"\s+(\S+)$")


@dataclasses.dataclass(frozen=True)
class Example:
    """One zero-shot example: the context the model reads, the continuations it is
    scored on (Lambada: the one target; BoolQ: " no", " yes") and the index of the right
    one."""

    context: str
    continuations: Tuple[str, ...]
    label: int = 0

    @property
    def target(self) -> str:
        return self.continuations[self.label]


def _records(path: str) -> Iterator[Tuple[int, str]]:
    """(line number, line) of the non-blank lines of a UTF-8 file."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte "
                                      f"{e.start} of the line)") from None
            if lineno == 1:
                line = line.lstrip("\ufeff")
            if line.strip():
                yield lineno, line.rstrip("\r\n")


def _json_object(path: str, lineno: int, line: str, expected: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{lineno}: not JSON ({e.msg}); expected {expected}") \
            from None
    if not isinstance(obj, dict):
        raise DataFormatError(f"{path}:{lineno}: a JSON {type(obj).__name__}, not an object; "
                              f"expected {expected}")
    return obj


def lambada_example(text: str, where: str) -> Example:
    """The context (the passage up to its last word) and target (" " + that word)."""
    passage = text.rstrip()
    match = _LAST_WORD.search(passage)
    if not match or not passage[:match.start()].strip():
        what = "is empty" if not passage.strip() else "is a single word"
        raise DataFormatError(f"{where}: the passage {what}: Lambada needs a context and a "
                              f"last word to predict (at least two words)")
    return Example(passage[:match.start()], (" " + match.group(1),))


LAMBADA_JSONL = 'OpenAI\'s Lambada jsonl, one {"text": passage} a line'


def read_lambada(path: str) -> List[Example]:
    """Lambada examples of a .jsonl file ({"text": ...} a line) or a plain text file (one
    passage a line), in file order."""
    out = []
    jsonl = path.endswith((".jsonl", ".json"))
    for lineno, line in _records(path):
        where = f"{path}:{lineno}"
        if jsonl:
            obj = _json_object(path, lineno, line, LAMBADA_JSONL)
            if not isinstance(obj.get("text"), str):
                raise DataFormatError(f"{where}: no \"text\" string; expected {LAMBADA_JSONL}")
            line = obj["text"]
        out.append(lambada_example(line, where))
    return out


BOOLQ_JSONL = ('BoolQ jsonl, one {"question": ..., "passage": ..., "answer": true or false} '
               'a line')


def boolq_prompt(passage: str, question: str) -> str:
    """lm-evaluation-harness's BoolQ prompt."""
    return f"{passage}\nQuestion: {question}?\nAnswer:"


def read_boolq(path: str) -> List[Example]:
    """BoolQ examples of a .jsonl file, in file order: the prompt, the choices " no" and
    " yes", the label 1 for a true answer ("answer", a JSON boolean; or SuperGLUE's
    "label": a boolean, or 0 / 1 as Hugging Face datasets exports it, which is what
    lm-evaluation-harness reads)."""
    out = []
    for lineno, line in _records(path):
        where = f"{path}:{lineno}"
        obj = _json_object(path, lineno, line, BOOLQ_JSONL)
        missing = [k for k in ("question", "passage") if not isinstance(obj.get(k), str)]
        if missing:
            raise DataFormatError(f"{where}: no {' or '.join(repr(k) for k in missing)} "
                                  f"string; expected {BOOLQ_JSONL}")
        key = "answer" if "answer" in obj or "label" not in obj else "label"
        answer = obj.get(key)
        if key == "label" and type(answer) is int and answer in (0, 1):
            answer = bool(answer)  # SuperGLUE as Hugging Face datasets exports it
        if not isinstance(answer, bool):
            got = "missing" if key not in obj else json.dumps(answer)
            also = " or the integer 0 or 1" if key == "label" else ""
            raise DataFormatError(f"{where}: \"{key}\" must be a JSON boolean (true or "
                                  f"false){also}, got {got}")
        out.append(Example(boolq_prompt(obj["passage"], obj["question"]), BOOLQ_CHOICES,
                           int(answer)))
    return out


def find_file(directory: str, names: Sequence[str], suffixes: Sequence[str], what: str,
              setting: str) -> str:
    """The first of `names` in `directory`; else its one file ending in one of
    `suffixes`; else DataNotFoundError naming what was looked for (`setting`: where the
    directory came from and how to set it)."""
    if not os.path.isdir(directory):
        raise DataNotFoundError(f"{what} directory {directory!r} does not exist ({setting})")
    for name in names:
        if os.path.isfile(os.path.join(directory, name)):
            return os.path.join(directory, name)
    found = sorted(p for s in suffixes for p in glob.glob(os.path.join(directory, "*" + s))
                   if os.path.isfile(p))
    if len(found) == 1:
        return found[0]
    expected = f"{' or '.join(names)} (or one {' / '.join(suffixes)} file)"
    if found:
        raise DataNotFoundError(f"{what} directory {directory!r} holds {len(found)} "
                                f"candidate files ({', '.join(map(os.path.basename, found))})"
                                f" and none named {' or '.join(names)}: name the one to "
                                f"read with INPUT_FILE")
    raise DataNotFoundError(f"no {what} file in {directory!r} ({setting}): expected "
                            f"{expected}")


def read(task: str, path: str) -> List[Example]:
    """The examples of `path` for `task` ('lambada' or 'boolq')."""
    return read_lambada(path) if task == "lambada" else read_boolq(path)

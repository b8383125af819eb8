"""INPUT_FILE: its texts read (UTF-8, one record a line) and processed exactly as the
model's training task processed its inputs and targets. Used by `t5lite.infer`
(`predict.infer`) and by `t5lite.eval`'s perplexity of a jsonl file.

    rule = file_inputs(model, task_name=None, checkpoint_path="/runs/llama_mnli",
                       raw_prompts=False)          # the task recorded in its config.gin
    for ex in tokenized_file("/data/inputs.txt", "predict", rule, lengths, model):
        ex["inputs_ids"]                          # e.g. mnli's: trimmed, EOS appended

Which rule applies (docs/eval_infer.md, "Inputs from a file"):

- the task MIXTURE_OR_TASK_NAME names, else the one CHECKPOINT_PATH's training run
  recorded (MODEL_DIR/config.gin, which `t5lite.train` writes): with an `inputs` feature,
  each text is tokenized with the feature's vocabulary, trimmed to its length and,
  where the feature adds EOS (every t5lite task), EOS appended (seqio's tokenize and
  append_eos_after_trim), for both families; targets (MODE 'score') the same way;
- a decoder-only model with RAW_PROMPTS=True, a language-modeling task (no inputs) or no
  known task: the text is a raw prompt, continued as it is (no EOS; the last `inputs`
  tokens kept), as a pretrained LM reads one (`model.inference_ids`); with no known task
  that is a warning, since a finetuned model's prompts need the task's EOS;
- an encoder-decoder model with no known task: T5's inputs, EOS appended (every T5
  task's); RAW_PROMPTS is refused.

A line that is not UTF-8, a jsonl record that is not JSON (a file cut short) or has no
string "inputs" is one DataFormatError naming the file and line.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from t5lite.data import edge
from t5lite.errors import ConfigError, DataFormatError, UnknownTaskError
from t5lite.models.common import features
from t5lite.models.common import model_kinds

log = logging.getLogger(__name__)


def has_text(path: Path) -> bool:
    """Whether the file holds anything but whitespace (read a block at a time)."""
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            if block.strip():
                return True
    return False


def read_lines(path: str, what: str = "INPUT_FILE") -> Iterator[Tuple[int, str, bool]]:
    """(line number, text, whether it ended in a newline) for each line of a UTF-8 text
    file (a line ends at "\n"; a "\r" before it and a byte-order mark before line 1 are
    dropped). A line that is not UTF-8 is one DataFormatError naming the file and line,
    as the Pile reader's (t5lite/data/files/jsonl_cursor.py)."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            complete = raw.endswith(b"\n")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                cut = ("" if complete else "; it is the last line and ends mid-character: "
                       "the file may be cut short")
                raise DataFormatError(
                    f"{what} {path}:{n}: not UTF-8 text ({e.reason} at byte {e.start} of "
                    f"the line){cut}; save the file as UTF-8") from None
            if n == 1:
                line = line.removeprefix("\ufeff")
            yield n, line.rstrip("\n").removesuffix("\r"), complete


def _file_examples(path: str, mode: str) -> Iterator[Dict[str, str]]:
    """{"inputs": text[, "targets": text]} per record of a jsonl file (by extension
    .jsonl / .json) or per line of a text file."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"INPUT_FILE {path} does not exist")
    is_jsonl = p.suffix in (".jsonl", ".json")
    for n, line, complete in read_lines(path):
        if not is_jsonl:
            if mode == "score":
                raise ConfigError(
                    f"INPUT_FILE {path} is plain text: MODE 'score' needs targets, give "
                    f"a .jsonl file with \"inputs\" and \"targets\" fields")
            yield {"inputs": line}
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            cut = ("" if complete else "; it is the last line and has no line end: the file "
                   "may be cut short")
            raise DataFormatError(f"INPUT_FILE {path}:{n} is not JSON ({e}){cut}") from None
        if not isinstance(record, dict) or "inputs" not in record:
            raise DataFormatError(f"INPUT_FILE {path}:{n} has no \"inputs\" field")
        if mode == "score" and "targets" not in record:
            raise DataFormatError(f"INPUT_FILE {path}:{n} has no \"targets\" field (MODE "
                                  f"'score' needs one)")
        for key in ("inputs", "targets"):
            if key in record and not isinstance(record[key], str):
                raise DataFormatError(f"INPUT_FILE {path}:{n}: \"{key}\" is a JSON "
                                      f"{type(record[key]).__name__}, not a string")
        ex = {"inputs": record["inputs"]}
        if "targets" in record:
            ex["targets"] = record["targets"]
        yield ex


def check_file(path: str, mode: str) -> int:
    """The number of examples in INPUT_FILE, read whole once so that a line that is not
    UTF-8 or not a record fails (one line naming it) before anything loads. MODE
    'perplexity' (t5lite.eval): a text file's lines are sequences."""
    if mode == "perplexity" and Path(path).suffix not in (".jsonl", ".json"):
        return sum(1 for _, line, _ in read_lines(path) if line.strip())
    return sum(1 for _ in _file_examples(path, "score" if mode == "perplexity" else mode))


@dataclasses.dataclass(frozen=True)
class FileInputs:
    """How the texts of INPUT_FILE become token ids: as `task` processes its inputs and
    targets in training (each feature's vocabulary; trimmed to its length, the
    vocabulary's EOS appended when the feature adds one, as seqio's tokenize and
    append_eos_after_trim do), or with `task` None as the model reads text no task
    processes (`model.inference_ids`: a decoder-only model's raw prompt, continued as
    it is). `why` says where the rule comes from. Built by `file_inputs`."""

    task: Optional[str]
    why: str
    vocabularies: Mapping[str, Any]
    add_eos: Mapping[str, bool]

    def ids(self, model, key: str, text: str, length: int) -> List[int]:
        """The token ids of one text of the feature `key` ("inputs" or "targets")."""
        if self.task is None:
            return model.inference_ids(self.vocabularies[key], text, length)
        return features.tokenize(self.vocabularies[key], text, length, self.add_eos[key])

    def record(self) -> Dict[str, Any]:
        """What the job record keeps of the rule (another rule makes other lines)."""
        return {"task": self.task, "add_eos": dict(self.add_eos)}


def trained_task(checkpoint_path: Optional[str]) -> Tuple[Optional[str], Optional[Path]]:
    """(MIXTURE_OR_TASK_NAME, the file naming it) of the training run that wrote
    CHECKPOINT_PATH, read from its MODEL_DIR/config.gin (`t5lite.train` writes every
    binding there) for a MODEL_DIR, its checkpoints directory, a step directory or an
    item in one; (None, None) when there is none (a `t5lite.convert` output, a remote
    path), (None, file) when the file names no task."""
    if not checkpoint_path or "://" in str(checkpoint_path):
        return None, None
    path = Path(checkpoint_path).absolute()
    candidates = [path] + [a.parent for a in (path, path.parent, path.parent.parent)
                           if a.name == "checkpoints"]
    config = next((d / "config.gin" for d in candidates if (d / "config.gin").is_file()),
                  None)
    if config is None:
        return None, None
    try:
        text = config.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, None
    match = re.search(r"^MIXTURE_OR_TASK_NAME\s*=\s*(.+?)\s*$", text, re.MULTILINE)
    try:
        value = ast.literal_eval(match.group(1)) if match else None
    except (ValueError, SyntaxError):
        value = None
    return (value if isinstance(value, str) and value else None), config


def file_inputs(model, *, task_name: Optional[str], checkpoint_path: Optional[str],
                raw_prompts: bool) -> FileInputs:
    """The rule for INPUT_FILE's texts (docs/eval_infer.md, "Inputs from a file"): the
    inputs (and targets) of the task MIXTURE_OR_TASK_NAME names, else of the task the
    checkpoint's training run recorded (`trained_task`), processed as that task's
    preprocessing processes them; a task without inputs (language modeling), RAW_PROMPTS
    or no known task: the model's own reading (`model.inference_ids`: T5's inputs end in
    EOS as every T5 task's do; a decoder-only model continues a raw prompt as it is).
    Which rule applies is logged; one that may differ from training warns."""
    tasks = edge.import_tasks()
    decoder_only = model.FEATURE_CONVERTER_KIND == model_kinds.DECODER_ONLY

    def own(why: str) -> FileInputs:
        vocab = edge.vocabulary()
        return FileInputs(None, why, {"inputs": vocab, "targets": vocab},
                          {"inputs": not decoder_only, "targets": not decoder_only})

    name, config = task_name, None
    if not name:
        name, config = trained_task(checkpoint_path)
    why = "MIXTURE_OR_TASK_NAME" if task_name else f"the task recorded in {config}"
    provider = None
    if name:
        try:
            provider = tasks.get_provider(name)
        except UnknownTaskError:
            if task_name:
                raise
            log.warning("%s names the task %r, which is not registered here", config, name)
    has_inputs = provider is not None and "inputs" in provider.output_features
    if raw_prompts:
        if not decoder_only:
            raise ConfigError("RAW_PROMPTS=True is for decoder-only models (a prompt "
                              "continued as it is); an encoder-decoder model reads its "
                              "inputs as its task does, EOS appended: drop RAW_PROMPTS")
        if has_inputs:
            log.warning("RAW_PROMPTS: each line of INPUT_FILE is a prompt continued as it "
                        "is (no EOS appended), not processed as the inputs of %r (%s), "
                        "which end in EOS in training", name, why)
        return own("RAW_PROMPTS=True")
    if provider is None:
        if decoder_only:
            log.warning(
                "INPUT_FILE: no known task says how the model was trained (neither "
                "MIXTURE_OR_TASK_NAME nor a MODEL_DIR/config.gin of CHECKPOINT_PATH's run "
                "names a registered one), so each line is a raw prompt continued as it is "
                "(no EOS appended), as for a pretrained language model; if the model was "
                "finetuned on an inputs -> targets task, set MIXTURE_OR_TASK_NAME to it (its "
                "inputs end in EOS, and a prompt without it decodes badly), or set "
                "RAW_PROMPTS=True to say raw prompts are meant")
            return own("no known task: raw prompts")
        log.info("INPUT_FILE: no known task; each line is an input trimmed to the inputs "
                 "length with EOS appended, as T5's tasks process their inputs")
        return own("no known task: T5's inputs, EOS appended")
    if not has_inputs:
        if not decoder_only:
            raise ConfigError(f"task {name!r} ({why}) has no inputs feature: an "
                              f"encoder-decoder model's INPUT_FILE lines are a task's "
                              f"inputs; set MIXTURE_OR_TASK_NAME to an inputs -> targets task")
        log.info("INPUT_FILE: %r (%s) is a language-modeling task: each line is a prompt "
                 "continued as it is (no EOS appended)", name, why)
        return own(f"{name!r} has no inputs: raw prompts")
    feats = provider.output_features
    rule = FileInputs(name, why, {k: feats[k].vocabulary for k in ("inputs", "targets")},
                      {k: bool(feats[k].add_eos) for k in ("inputs", "targets")})
    log.info("INPUT_FILE: each line is processed as the inputs of %r (%s): trimmed to the "
             "inputs length%s, as in training", name, why,
             ", EOS appended" if rule.add_eos["inputs"] else "")
    return rule


def tokenized_file(path: str, mode: str, rule: FileInputs, lengths: Mapping[str, int],
                   model) -> Iterator[Dict[str, Any]]:
    """Each example with its token ids, as `rule` processes INPUT_FILE's texts."""
    for ex in _file_examples(path, mode):
        out = dict(ex, inputs_ids=rule.ids(model, "inputs", ex["inputs"], lengths["inputs"]))
        if "targets" in ex:
            out["targets_ids"] = rule.ids(model, "targets", ex["targets"], lengths["targets"])
        yield out

"""A Hugging Face `tokenizer.json` read as it is (the `tokenizers` library; no network, no
TensorFlow): the byte-level BPE of LLaMA-3, Qwen and Mistral's newer releases.

    tok = TokenizerFile("/models/Llama-3.1-8B/tokenizer.json")
    tok.encode("Hello!")      # tokenizers' own ids, no special token added
    tok.decode(ids)           # the text, special tokens left out
    tok.bos_id, tok.eos_id    # from tokenizer_config.json beside it, or by name

Special ids come from `tokenizer_config.json` beside the file (`eos_token`, `bos_token`:
a string or {"content": ...}, as transformers writes them), else from the names these
families use (EOS `<|end_of_text|>`, `<|endoftext|>`, `</s>`; BOS `<|begin_of_text|>`,
`<s>`). Raw text is encoded as it is: no chat template, no BOS.

Id 0 is a token of text in these vocabularies (`!` in LLaMA-3's and Qwen's); how t5lite
keeps it apart from padding is t5lite/data/vocabularies.py's and features.py's business.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, List, Optional, Tuple

from t5lite.errors import VocabularyError

EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>")
CONFIG_NAME = "tokenizer_config.json"


def is_tokenizer_json(path: str) -> bool:
    """Whether a vocabulary path names a tokenizer.json (by its extension) rather than a
    SentencePiece model."""
    return str(path).endswith(".json")


def _token_name(value: Any) -> Optional[str]:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class TokenizerFile:
    """One tokenizer.json and the special tokens its tokenizer_config.json names."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer
        self.path = str(path)
        try:
            with open(self.path, "rb") as f:
                self.tokenizer = Tokenizer.from_str(f.read().decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - I/O, UTF-8, JSON and tokenizers' own errors
            reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise VocabularyError(
                f"vocabulary file {self.path!r} is not a Hugging Face tokenizer.json "
                f"({reason}); point VOCABULARY_PATH at the tokenizer.json of a model "
                f"directory, or at a SentencePiece .model file") from None
        self.bos_id, self.eos_id = self._special_ids()

    @property
    def size(self) -> int:
        """Every id, the added (special) tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> List[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids if 0 <= int(i) < self.size]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _special_ids(self) -> Tuple[Optional[int], Optional[int]]:
        """(bos, eos): tokenizer_config.json's names, else the families' own."""
        names = {}
        config = os.path.join(os.path.dirname(self.path), CONFIG_NAME)
        if os.path.exists(config):
            try:
                with open(config) as f:
                    names = json.load(f)
            except (ValueError, UnicodeDecodeError):
                raise VocabularyError(f"{config} (beside the vocabulary {self.path}) is not "
                                      f"JSON; fix or remove it") from None
            names = names if isinstance(names, dict) else {}
        found = []
        for field, fallbacks in (("bos_token", BOS_NAMES), ("eos_token", EOS_NAMES)):
            name = _token_name(names.get(field))
            ids = [self.tokenizer.token_to_id(n) for n in ((name,) if name else fallbacks)]
            found.append(next((i for i in ids if i is not None), None))
            if name and found[-1] is None:
                raise VocabularyError(f"{config} names {field} {name!r}, which {self.path} "
                                      f"does not hold")
        return found[0], found[1]

    def check(self, where: str) -> None:
        """VocabularyError unless it has an EOS above 0 (every task sequence ends in it)."""
        if self.eos_id is None or self.eos_id == 0:
            raise VocabularyError(
                f"vocabulary file {self.path!r} ({where}) has "
                + ("no EOS token" if self.eos_id is None else "EOS at id 0, the padding id")
                + f": t5lite's tasks end every sequence with EOS; put a {CONFIG_NAME} naming "
                f"its eos_token beside it (transformers writes one), or name it one of "
                f"{', '.join(EOS_NAMES)}")

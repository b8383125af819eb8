"""What the model's batches hold: the feature converter of a model kind (T5X's names),
and the feature lengths a task and a model kind need."""
from __future__ import annotations

from typing import Dict, Mapping, Optional

from t5lite.data import packing
from t5lite.data.tf_env import as_written, import_tensorflow
from t5lite.errors import DataError
from t5lite.models.common.model_kinds import DECODER_ONLY, ENCODER_DECODER, MODEL_KINDS

import_tensorflow()  # (hidden GPUs, quiet start-up) before SeqIO imports it
import seqio  # noqa: E402


class _AsWritten:
    """A seqio converter traced `as_written` (AutoGraph off: its control flow is already
    TensorFlow ops), its packing `packing.pack_dataset` (SeqIO's rows, its loop written
    as graph code) instead of `seqio.utils.trim_and_pack_dataset` (a Python loop over a
    tensor, which only AutoGraph makes a graph). Wherever it is called (t5lite's
    pipeline, seqio's Evaluator), on a dataset whose task already made its examples."""

    def __call__(self, ds, task_feature_lengths: Mapping[str, int]):
        return as_written(super().__call__)(ds, task_feature_lengths)

    def _pack_or_pad(self, ds, packed_lengths: Mapping[str, int]):
        if self.pack and not self._use_custom_packing_ops:
            return packing.pack_dataset(ds, packed_lengths)
        return super()._pack_or_pad(ds, packed_lengths)


class EncDecConverter(_AsWritten, seqio.EncDecFeatureConverter):
    pass


class LMConverter(_AsWritten, seqio.LMFeatureConverter):
    pass


class PrefixLMConverter(_AsWritten, seqio.PrefixLMFeatureConverter):
    pass


def feature_converter(model_kind: str, pack: bool, with_inputs: bool = False,
                      bos_id: int = 0, zero_stand_in: Optional[int] = None):
    """`convert(ds, task_feature_lengths) -> ds`: seqio's converter to T5X model
    features for `model_kind`, its decoder inputs starting with `bos_id` (the model's).
    A decoder-only model reads an inputs -> targets task as one sequence, prompt then
    answer, with the loss on the answer only (seqio.PrefixLMFeatureConverter, as T5X's
    decoder-only models do).

    `zero_stand_in` (a vocabulary whose id 0 is a token of text writes it so in a task's
    stream, `vocabularies.TokenizerJsonVocabulary`): the token features leave the
    converter with it turned back into 0 (`ZeroKeptConverter`), after seqio's padding,
    loss weights (`targets != 0`) and packing have counted it as the token it is."""
    if zero_stand_in is not None:
        return ZeroKeptConverter(feature_converter(model_kind, pack, with_inputs, bos_id),
                                 zero_stand_in)
    if model_kind == ENCODER_DECODER:
        return EncDecConverter(pack=pack, bos_id=bos_id)
    if model_kind == DECODER_ONLY:
        if with_inputs:
            return PrefixLMConverter(pack=pack, loss_on_targets_only=True, bos_id=bos_id)
        return LMConverter(pack=pack, bos_id=bos_id)
    raise ValueError(f"model_kind must be one of {MODEL_KINDS}, got {model_kind!r}")


class ZeroKeptConverter:
    """A feature converter whose token features (`*_tokens`) leave it with `stand_in`
    (a real id 0 as the task's stream writes it) turned back into 0: a real 0 reaches
    the model as 0 with its loss weight and segment id, padding as 0 with none."""

    def __init__(self, converter: seqio.FeatureConverter, stand_in: int):
        self.converter, self.stand_in = converter, int(stand_in)

    def __call__(self, ds, task_feature_lengths: Mapping[str, int]):
        tf = import_tensorflow()

        def restore(ex):
            return {k: tf.where(v == self.stand_in, 0, v) if k.endswith("_tokens") else v
                    for k, v in ex.items()}

        # (the inner converter already runs as written; so does this map)
        return as_written(self.converter(ds, task_feature_lengths).map)(restore)


def has_inputs(provider) -> bool:
    """Whether a task (or mixture) has an inputs feature (inputs -> targets)."""
    return "inputs" in provider.output_features


def check_lengths(name: str, provider, model_kind: str,
                   feature_lengths: Mapping[str, Optional[int]]) -> Dict[str, int]:
    lengths = {k: int(v) for k, v in feature_lengths.items() if v}
    if has_inputs(provider):
        if set(lengths) != {"inputs", "targets"}:
            what = ("an encoder_decoder model" if model_kind == ENCODER_DECODER else
                    f"a decoder_only model on the inputs -> targets task {name!r} (prompt "
                    f"then answer, in one sequence of inputs + targets tokens)")
            raise DataError(f"{what} needs feature lengths for 'inputs' and 'targets', got "
                            f"{dict(feature_lengths)}")
        return lengths
    if model_kind == ENCODER_DECODER:
        raise DataError(f"task {name!r} has no 'inputs' feature: an encoder_decoder model "
                        f"needs an input/target task (e.g. pile_span_corruption)")
    if "targets" not in lengths:
        raise DataError(f"a decoder_only model needs a feature length for 'targets', "
                        f"got {dict(feature_lengths)}")
    return {"targets": lengths["targets"]}


def sequence_lengths(model_kind: str, feature_lengths: Mapping[str, int]) -> Dict[str, int]:
    """The lengths of the model's batches for a task's checked `feature_lengths`: an
    encoder-decoder's inputs and targets; a decoder-only model's one sequence, as
    "targets" (inputs + targets tokens for a prefix-LM task)."""
    if model_kind == ENCODER_DECODER:
        return dict(feature_lengths)
    return {"targets": sum(feature_lengths.values())}

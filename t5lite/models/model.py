"""The model wrappers by family and `model_for_config`, which builds a config's wrapper.
What a wrapper answers (so that no caller branches on its family) is stated in
`t5lite.models.common.base_model`; the families live in `encoder_decoder/model.py` and
`decoder_only/model.py`, and are named here for callers.
"""
from __future__ import annotations

from t5lite.models.common.base_model import MODEL_EOS, Batch, BaseModel  # noqa: F401 (for callers)
from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.decoder_only.model import DecoderOnlyModel
from t5lite.models.encoder_decoder.model import EncoderDecoderModel

MODEL_CLASSES = {T5Config: EncoderDecoderModel, DecoderConfig: DecoderOnlyModel}


def model_for_config(config, **kwargs) -> BaseModel:
    """The model wrapper of `config`'s family (kwargs: z_loss, label_smoothing, ...)."""
    if type(config) not in MODEL_CLASSES:
        raise TypeError(f"no model family for config type {type(config).__name__}; "
                        f"expected one of {[c.__name__ for c in MODEL_CLASSES]}")
    return MODEL_CLASSES[type(config)](config, **kwargs)

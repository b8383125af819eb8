"""Architecture settings of the two model families, as plain frozen dataclasses.

Gin binds these at the edges (`t5lite/config/registry.py`); nothing here imports gin.
`HF_MODEL_TYPE` names the Hugging Face `model_type` each family reads and writes
(`t5lite.interop.hf`).

Each family's settings live in its room (`encoder_decoder/config.py`,
`decoder_only/config.py`, with their parameter trees), the settings both take in
`common/settings.py`; this module is where the rest of t5lite reads them.
"""
from t5lite.models.decoder_only.config import DecoderConfig  # noqa: F401
from t5lite.models.encoder_decoder.config import T5Config  # noqa: F401
from t5lite.models.common.settings import (  # noqa: F401
    ATTENTION_IMPLS, ATTENTION_MASKS, FP8_BACKENDS, FP8_RECIPES, PRECISIONS, REMAT_POLICIES,
    MoeSettings, Switches, moe_macros, setting_macros, switch_macros)

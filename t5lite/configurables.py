"""The one place where t5lite registers things with Gin ("gin at the edges").

Everything is registered with `gin.external_configurable` under the `t5lite` module, so
gin files may use the short name (`T5Config.emb_dim = 512`) or the qualified one
(`t5lite.T5Config.emb_dim = 512`). The registered objects are the original classes:
constructing `@T5Config()` in gin yields a plain `t5lite.models.configs.T5Config`.

Import this module (entry points do, through `t5lite.gin_utils.parse_gin`) before parsing
any gin file. Registering twice is harmless: the module body runs once per process.
"""
from __future__ import annotations

import gin

from t5lite.models import configs
from t5lite.models import model as _model

MODULE = "t5lite"

T5Config = gin.external_configurable(configs.T5Config, module=MODULE)
DecoderConfig = gin.external_configurable(configs.DecoderConfig, module=MODULE)
EncoderDecoderModel = gin.external_configurable(_model.EncoderDecoderModel, module=MODULE)
DecoderOnlyModel = gin.external_configurable(_model.DecoderOnlyModel, module=MODULE)

REGISTERED = ("T5Config", "DecoderConfig", "EncoderDecoderModel", "DecoderOnlyModel")

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

# ----------------------------------------------------------------------------- optimizers
# Schedules and optimizers (t5lite/optimizers.py). In gin:
#   adamw.learning_rate = @cosine_with_warmup()
#   cosine_with_warmup.peak = 6e-4  (and warmup_steps, decay_steps)
# A plain number also works: `adamw.learning_rate = 1e-4`. gin has a builtin `constant`
# too, so the constant schedule must be written qualified: `@t5lite.constant()`.

from t5lite import optimizers as _optimizers  # noqa: E402

constant = gin.external_configurable(_optimizers.constant, module=MODULE)
rsqrt_decay = gin.external_configurable(_optimizers.rsqrt_decay, module=MODULE)
linear_decay = gin.external_configurable(_optimizers.linear_decay, module=MODULE)
cosine_with_warmup = gin.external_configurable(_optimizers.cosine_with_warmup, module=MODULE)
adafactor = gin.external_configurable(_optimizers.adafactor, module=MODULE)
adamw = gin.external_configurable(_optimizers.adamw, module=MODULE)

OPTIMIZER_REGISTERED = ("constant", "rsqrt_decay", "linear_decay", "cosine_with_warmup",
                        "adafactor", "adamw")
REGISTERED = REGISTERED + OPTIMIZER_REGISTERED

# ----------------------------------------------------------------------------- training
# `python -m t5lite.train` calls `train(model=<MODEL>)`; configs/runs/*.gin bind the rest
# from T5X's macro vocabulary.

from t5lite import train as _train  # noqa: E402

train = gin.external_configurable(_train.train, module=MODULE)
REGISTERED = REGISTERED + ("train",)

# ----------------------------------------------------------------------------- eval / infer
# `python -m t5lite.eval` calls `evaluate(model=<MODEL>)`, `python -m t5lite.infer` calls
# `infer(model=<MODEL>)`; configs/runs/{eval,infer}.gin bind the rest.

from t5lite import eval as _eval  # noqa: E402
from t5lite import infer as _infer  # noqa: E402

evaluate = gin.external_configurable(_eval.evaluate, module=MODULE)
infer = gin.external_configurable(_infer.infer, module=MODULE)
REGISTERED = REGISTERED + ("evaluate", "infer")

"""The one place where t5lite registers things with Gin ("gin at the edges").

Everything is registered with `gin.external_configurable` under the `t5lite` module, so
gin files may use the short name (`T5Config.emb_dim = 512`) or the qualified one
(`t5lite.T5Config.emb_dim = 512`). The registered objects are the original classes and
functions: constructing `@T5Config()` in gin yields a plain
`t5lite.models.configs.T5Config`.

    models          T5Config, DecoderConfig, EncoderDecoderModel, DecoderOnlyModel
    optimizers      constant, rsqrt_decay, linear_decay, cosine_with_warmup, adafactor, adamw
    settings        MeshSettings, CheckpointSettings, DataSettings, DecodingSettings, WatchdogSettings,
                    InferenceEvalSettings, SkipSettings (configs/runs/*.gin bind their
                    fields to T5X's macro names)
    entry functions train (python -m t5lite.train), evaluate (t5lite.eval), infer
                    (t5lite.infer), and InferenceEvaluation (train.inference_evaluator)

`t5lite.config.parsing` imports this module, so parsing any gin file registers them.
Registering twice is harmless: the module body runs once per process.
"""
from __future__ import annotations

import gin

from t5lite.data.edge import DataSettings as _DataSettings
from t5lite.inference import evaluate as _evaluate
from t5lite.inference import predict as _predict
from t5lite.inference import session as _session
from t5lite.inference import train_eval as _train_eval
from t5lite.models import configs as _configs
from t5lite.models import model as _model
from t5lite.runtime.checkpointing import checkpoints as _checkpoints
from t5lite.runtime import loop as _loop
from t5lite.optim import optimizers as _optimizers
from t5lite.runtime import partitioning as _partitioning
from t5lite.runtime.process import watchdog as _watchdog
from t5lite.runtime import skipped_steps as _skipped_steps

MODULE = "t5lite"


def _register(obj, name=None):
    return gin.external_configurable(obj, name=name, module=MODULE)


# ----------------------------------------------------------------------------- models
T5Config = _register(_configs.T5Config)
DecoderConfig = _register(_configs.DecoderConfig)
EncoderDecoderModel = _register(_model.EncoderDecoderModel)
DecoderOnlyModel = _register(_model.DecoderOnlyModel)
MODEL_REGISTERED = ("T5Config", "DecoderConfig", "EncoderDecoderModel", "DecoderOnlyModel")

# ----------------------------------------------------------------------------- optimizers
# In gin:
#   adamw.learning_rate = @cosine_with_warmup()
#   cosine_with_warmup.peak = 6e-4  (and warmup_steps, decay_steps)
# A plain number also works: `adamw.learning_rate = 1e-4`. gin has a builtin `constant`
# too, so the constant schedule must be written qualified: `@t5lite.constant()`.
constant = _register(_optimizers.constant)
rsqrt_decay = _register(_optimizers.rsqrt_decay)
linear_decay = _register(_optimizers.linear_decay)
cosine_with_warmup = _register(_optimizers.cosine_with_warmup)
adafactor = _register(_optimizers.adafactor)
adamw = _register(_optimizers.adamw)
OPTIMIZER_REGISTERED = ("constant", "rsqrt_decay", "linear_decay", "cosine_with_warmup",
                        "adafactor", "adamw")

# ----------------------------------------------------------------------------- settings
MeshSettings = _register(_partitioning.MeshSettings)
CheckpointSettings = _register(_checkpoints.CheckpointSettings)
DataSettings = _register(_DataSettings)
DecodingSettings = _register(_session.DecodingSettings)
InferenceEvalSettings = _register(_train_eval.InferenceEvalSettings)
WatchdogSettings = _register(_watchdog.WatchdogSettings)
SkipSettings = _register(_skipped_steps.SkipSettings)
SETTINGS_REGISTERED = ("MeshSettings", "CheckpointSettings", "DataSettings",
                       "DecodingSettings", "InferenceEvalSettings", "WatchdogSettings",
                       "SkipSettings")

# ----------------------------------------------------------------------------- entry functions
# `python -m t5lite.train` calls `train(model=<MODEL>)`, `python -m t5lite.eval`
# `evaluate(model=<MODEL>)`, `python -m t5lite.infer` `infer(model=<MODEL>)`;
# configs/runs/{pretrain,eval,infer}.gin bind the rest.
train = _register(_loop.train, "train")
evaluate = _register(_evaluate.evaluate, "evaluate")
infer = _register(_predict.infer, "infer")
InferenceEvaluation = _register(_train_eval.InferenceEvaluation)
ENTRY_REGISTERED = ("train", "evaluate", "infer", "InferenceEvaluation")

REGISTERED = MODEL_REGISTERED + OPTIMIZER_REGISTERED + SETTINGS_REGISTERED + ENTRY_REGISTERED

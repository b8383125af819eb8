"""The two kinds of model, as the data layer builds their batches: a model states its kind
(`model.FEATURE_CONVERTER_KIND`), and the feature converters and synthetic batches follow
it. No imports: the numpy-only readers take these names too."""

ENCODER_DECODER = "encoder_decoder"  # encoder_input_tokens + decoder_* (T5)
DECODER_ONLY = "decoder_only"        # decoder_* only; an inputs -> targets task as a prefix LM
MODEL_KINDS = (ENCODER_DECODER, DECODER_ONLY)

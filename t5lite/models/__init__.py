"""The model library: networks, layers, model wrappers and what they need (losses,
decoding over a KV cache, precision, parameter layouts, FLOPs). No TensorFlow, SeqIO or
t5 here; nothing above this package is imported.

    configs.py    T5Config / DecoderConfig: architecture and performance switches
    layers.py     dense, attention, MLP, norms, embeddings, relative position bias, RoPE
    stack.py      a stack of layers: a Python loop or nn.scan, with remat policies
    t5.py         the T5 v1.1 encoder-decoder network
    decoder.py    the decoder-only network (GPT, LLaMA)
    model.py      model wrappers: loss, logits, predict / score, and the family answers
                  (feature converter kind, FLOPs, inference batches) callers ask for
    features.py   inference batches from token lists (numpy)
    losses.py     cross entropy with z-loss and label smoothing, normalization
    decoding.py   greedy, sampling and beam search over a KV cache (pure, jittable)
    precision.py  native FP8 (flax fp8 ops) and its state collection
    layouts.py    conversions between fused/unfused QKV and scanned/unscanned layers
    flops.py      model-FLOP formulas (MFU convention)
"""

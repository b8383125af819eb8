"""t5lite: T5X-style training of T5 v1.1, GPT and LLaMA models in JAX/Flax.

The map (docs/architecture.md has the data flow of a training run):

    train eval infer bench info     the commands, `python -m t5lite.<name>`: thin wiring
    convert vocab deps              over the library below
    errors.py                       the error types every layer raises
    config/                         command-line flags, gin files, registrations, the
                                    commands' shared body and their one-line errors
    inference/                      decoding sessions, task evaluation, predict / score,
                                    evaluation during training
    interop/                        Hugging Face in/out, conversion, converted checkpoints
    runtime/                        partitioner, train step, state, optimizers,
                                    checkpoints, metrics, the training loop, benchmarks
    data/                           vocabularies, SeqIO tasks, sources, the input pipeline,
                                    synthetic batches, the demo corpus
    models/                         layers, T5 and decoder-only networks, model wrappers,
                                    losses, decoding, precision, layouts, FLOPs

Imports run one way: errors <- models <- data <- runtime <- inference / interop <- config
<- commands (tests/test_architecture.py checks it).
"""

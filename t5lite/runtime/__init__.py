"""The training runtime: what turns a model and batches into trained, saved parameters on
a mesh. Imports models and data, never inference, interop, config or the commands.

    partitioning.py      mesh (data, fsdp, tensor), logical-axis rules, Partitioner,
                         MeshSettings, the multi-process start
    train_state.py       the TrainState pytree
    train_step.py        the pure, donated train step with gradient accumulation
    optimizers.py        Adafactor, AdamW and learning-rate schedules
    checkpoint_files.py  checkpoints on disk: layout, complete steps, user paths
    checkpoint_trees.py  does a checkpoint's tree fit the model (one-line mismatches)
    checkpoints.py       save / resume (Orbax), the finetuning restore, CheckpointSettings
    disk_space.py        a full disk: room checks, one DiskFullError line for every writer
    background_reports.py  dropping what background threads print about a failure
                         that their owner raises (abandoned reads, a full disk)
    metrics.py           throughput and MFU, the log line, MetricWriter, progress bar
    event_files.py       TensorBoard scalars through TensorBoard's own writer
    periods.py           LOG/CHECKPOINT/EVAL_PERIOD validation and "is this step due?"
    run.py               build_run: partitioner + train step + data iterator
    loop.py              train: the training loop (InferenceEvalSettings)
    benchmark.py         timing the train step (python -m t5lite.bench)
    footprint.py         parameter count, FLOPs, optimizer bytes (python -m t5lite.info)
"""

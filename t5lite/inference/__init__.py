"""Inference: restored checkpoints decoding on a mesh. Imports runtime, data and models.

    session.py     Session (predict / score on a mesh), load_session, DecodingSettings
    task_eval.py   seqio's Evaluator over a task split with a Session, predictions files
    evaluate.py    evaluate(): python -m t5lite.eval's library
    predict.py     infer(): python -m t5lite.infer's library (files or task splits, resume)
    train_eval.py  InferenceEvaluation: evaluation every EVAL_PERIOD steps of training
"""

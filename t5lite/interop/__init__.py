"""Interoperability: Hugging Face checkpoints in and out, and the converted-checkpoint
format. Imports runtime and models.

    hf.py                 load_pretrained / save_pretrained (safetensors, never pickle)
    hf_config.py          config.json <-> T5Config / DecoderConfig
    hf_families.py        each family's tensor mapping onto its HF model_type
    checkpoint_format.py  parameters-only Orbax checkpoints (save_params / load_params)
    convert.py            convert_hf (python -m t5lite.convert's library), model.gin text
"""

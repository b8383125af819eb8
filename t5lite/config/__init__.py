"""Configuration at the edge: command-line flags, gin files and macros, registrations,
and the shared body of the commands with their one-line errors. Imports every library
layer; only the commands import it.

    flags.py     --gin_file / --gin.NAME=VALUE / --gin_bindings / multi-process flags
    parsing.py   search path, parse_gin, resolve_macro, one-line gin errors, typo check
    registry.py  everything gin may name (models, optimizers, settings, entry functions)
    command.py   logging, run_model_command (train / eval / infer), run_main
"""

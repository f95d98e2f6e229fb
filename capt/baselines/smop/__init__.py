"""SMoP (Choi et al., EMNLP 2023): several short soft prompts and a linear router that picks one per input.

The config is in `config` (no torch), the model in `model`.
"""

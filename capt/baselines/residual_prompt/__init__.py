"""Residual Prompt Tuning (Razdaibiedina et al. 2023): the soft prompt reparameterised by a residual MLP.

The config (`config.py`) loads no torch; the model is `capt.baselines.residual_prompt.model.ResidualPromptModel`.
"""

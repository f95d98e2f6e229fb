"""SuperPos-Prompt (Sadraei Javaheri et al. 2024): each prompt token a learned superposition of vocabulary embeddings.

The config (`config.py`) loads no torch; the model is `capt.baselines.superpos_prompt.model.SuperPosPromptModel`.
"""

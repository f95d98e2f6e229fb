"""Visual Fourier Prompt Tuning (Zeng et al. 2024), carried over to text: Fourier-transformed prompt tokens beside
plain ones.

The config (`config.py`) loads no torch; the model is `capt.baselines.vfpt.model.VfptModel`.
"""

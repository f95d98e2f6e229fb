"""Bottleneck adapters (Houlsby et al. 2019): config in `config`, model in `model` (imported on first use)."""

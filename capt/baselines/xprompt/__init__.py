"""XPrompt (Ma et al., EMNLP 2022): prompt tuning, hierarchical structured pruning and rewinding.

`config` holds `XPromptConfig` (no torch); `model` holds `XPromptModel`."""

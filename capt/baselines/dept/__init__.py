"""DePT, decomposed prompt tuning (Shi & Lipani 2024): config in `config`, model in `model` (imported on first use)."""

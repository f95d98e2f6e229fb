"""Training jobs' machinery: the one loop (`loop`), setup, outputs, checkpoints, packs, result, dataset card."""

"""One training job's machinery, behind `pipelines.train`: setup, outputs, checkpoints, phases, result, dataset card."""

"""Whether a base model's capsules can be served in mixed-task batches, decided before anything deploys.

The driver asks this before it starts Ray, so an unsupported model is one `error:` paragraph within seconds
rather than a replica's traceback after a minute. The model is built on the meta device (no weights, no memory):
what matters is its structure, e.g. whether an encoder classifier's head is one linear layer the bank can gather.
"""

from __future__ import annotations

from pipelines.models.shape import model_shape, read_model_config


def servable_problem(name: str) -> str | None:
    """Why the capsules of base model `name` cannot share one served bank (None when they can)."""
    try:
        spec = model_shape(name).spec
    except ValueError as err:  # unreadable config or an unsupported model_type, named
        return str(err)
    if not spec.classifier_head:  # text-to-text models answer with words: any task shares the batch
        return None
    import torch
    import transformers

    from capt.heads import linear_head_problem

    with torch.device("meta"):  # structure only: no weights are allocated
        model = getattr(transformers, spec.auto_model_class).from_config(read_model_config(name))
    return linear_head_problem(model)

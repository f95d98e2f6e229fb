"""EPT (Lan et al., AAAI 2025): a short soft prompt fused with a low-rank input-embedding update, reweighted
over several learned subspaces by a gating network.

The config is in `config` (no torch), the model in `model`.
"""

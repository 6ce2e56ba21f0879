"""placer: expert-placement optimizer for serving Mixture-of-Experts models.

Vocabulary (see docs/glossary.md): a *logical expert* is an expert of the model
(``0..E-1`` per layer); a *physical expert* or *slot* is one copy of its weights
on one GPU (``0..P-1`` per layer, GPU ``g`` holds slots ``g*S .. g*S+S-1``);
``R = P - E`` *redundant experts* hold extra *replicas* of hot experts.
"""

__version__ = "0.1.0"

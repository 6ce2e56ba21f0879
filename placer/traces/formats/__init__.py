"""The built-in trace formats, one module each (``jsonl`` and ``npz`` packages of their
parts); each registers itself with :func:`placer.traces.registry.register_format` when
imported, and detection tries them in registration order: the imports below are that
order (kept by the ``isort: split`` markers)."""

from placer.traces.formats import jsonl

# isort: split
from placer.traces.formats import npz

# isort: split
from placer.traces.formats import aggregated, sglang, trtllm

__all__ = ["aggregated", "jsonl", "npz", "sglang", "trtllm"]

"""The built-in trace formats, one module each (``jsonl`` a package of its parts); each
registers itself with :func:`placer.traces.registry.register_format` when imported, in
detection order."""

from placer.traces.formats import aggregated, jsonl, npz, sglang, trtllm

__all__ = ["aggregated", "jsonl", "npz", "sglang", "trtllm"]

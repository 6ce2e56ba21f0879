"""Files in and out, shared by every reader and writer: atomic writes and the mapping of
OS errors (:mod:`placer.io.fileio`), YAML/JSON documents that remember where each value
came from (:mod:`placer.io.yaml_schema`), and zip archives read without trusting them
(:mod:`placer.io.ptfile`: PyTorch ``.pt`` files and ``.npz`` members)."""

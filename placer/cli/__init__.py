"""The ``placer`` command line: a thin layer over the library.

Each command group lives in its own module exposing ``register(app)``;
``placer.cli.main`` assembles them.
"""

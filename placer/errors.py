"""Errors and warnings raised by placer.

Every problem with a user's input is a :class:`PlacerError` subclass that says
*what* is wrong, *where* (file and line, YAML path, array and index, option),
and carries a ``hint`` on how to fix it.  The CLI turns these into::

    error: traces/run.jsonl:17: expert id 300 is out of range [0, 256)
    hint: check --num-experts or the header's num_experts

and exits with :attr:`PlacerError.exit_code` (1 for data errors, 2 for usage
errors).  Library code never prints.

The library names its own parameters, never the command line's flags: a parameter as
the place of an error is a :class:`Param` (``where=Param("slots_per_gpu")``), and a
message or hint refers to a parameter in backticks (``pass `model` and `topology```).
The CLI shows both as the flag that sets the parameter (``--slots-per-gpu``,
``--model``): :mod:`placer.cli.flags` holds that mapping, in one place.
"""

from __future__ import annotations


class Param(str):
    """The name of a library parameter, as the place of an error.

    >>> str(UsageError("must be positive", where=Param("slots_per_gpu")))
    'slots_per_gpu: must be positive'
    """

    __slots__ = ()


class PlacerError(Exception):
    """Base class of every error placer raises on purpose.

    Parameters
    ----------
    message:
        What is wrong, in one sentence, without the location.
    where:
        Where it is wrong: ``"file.jsonl:17"``, ``"topo.yaml: nodes[1].gpus"``,
        ``"load.npz: load[3, 7]"``, or a parameter: ``Param("slots_per_gpu")``.
    hint:
        What the user can do about it.
    """

    exit_code = 1

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class DataError(PlacerError):
    """Input data (a trace, a YAML file, a placement) is malformed or inconsistent."""


class TraceError(DataError):
    """A routing trace or statistics file cannot be read."""


class TopologyError(DataError):
    """A topology description is invalid."""


class ModelError(DataError):
    """A model description is invalid or unknown."""


class PlacementError(DataError):
    """A placement is invalid for the model or the cluster."""


class EngineFormatError(DataError):
    """A serving engine's file breaks one of that engine's rules."""


class InfeasibleError(DataError):
    """The problem has no solution (for example the memory budget is too small)."""


class UsageError(PlacerError):
    """The command line or API call is inconsistent (exit code 2)."""

    exit_code = 2


class PlacerWarning(UserWarning):
    """Base class of placer's warnings: data that is suspicious but usable."""


class TraceWarning(PlacerWarning):
    """A trace looks synthetic, truncated or broken."""


class ScalingWarning(PlacerWarning):
    """Scaling loads to integers for CP-SAT lost precision."""

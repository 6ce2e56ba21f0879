"""The command classes behind every ``placer`` command: help, usage errors, defaults.

Typer builds each command; these subclasses make them behave like placer:

- help: ``-h`` as well as ``--help`` (:data:`CONTEXT_SETTINGS`), plain metavars
  (``--topology NAME|FILE``, ``TRACE...``, never a Python type), examples in the epilog;
- usage errors (an unknown option, a bad value, a missing argument) in placer's
  ``error:`` / ``hint:`` form with the closest valid option, exit code 2, instead of the
  parser's own block (:func:`usage_errors`);
- numbers: a float option refuses NaN and infinity, and every number option says what it
  expected and got, with the valid range and the nearest valid value as the hint
  (:func:`_guard_numbers`; :data:`OPTION_RANGES` for options that declare no range);
- defaults: the options named by :data:`placer.cli.config.SETTINGS` take their defaults from
  ``PLACER_*`` variables and the config file (:meth:`PlacerCommand.parse_args`), in one
  order for every option: the command line, else the environment, else ``placer.toml``,
  else the built-in default; a command says once, where it registers, which configured
  defaults yield to what its command line gives instead (:func:`placer_command`);
- ``--policy``, which meant two things, is answered with the option to use instead.

Register a command with ``app.command(NAME, cls=PlacerCommand, epilog=examples(...))``
(``cls=placer_command(topology=given("num_gpus"))`` when a configured default yields)
and make every Typer with :func:`new_typer`.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import typer
from typer.core import TyperCommand, TyperGroup

from placer.cli.common import configured_options, fail
from placer.cli.config import SETTINGS, SOURCE_BUILT_IN, Default, load_config
from placer.cli.flags import running_command
from placer.cli.options import retired_policy
from placer.errors import PlacerError, UsageError

# Typer raises click's exceptions, from click or from its own copy of click (typer >= 0.16
# vendors it): take them from where typer.BadParameter lives.
_exceptions = sys.modules[typer.BadParameter.__module__]
ClickUsageError: Any = _exceptions.UsageError
BadParameter: Any = _exceptions.BadParameter
NoSuchOption: Any = _exceptions.NoSuchOption
BadOptionUsage: Any = _exceptions.BadOptionUsage
MissingParameter: Any = _exceptions.MissingParameter
NoArgsIsHelpError: Any = getattr(_exceptions, "NoArgsIsHelpError", None)

#: ``-h`` and ``--help`` on every command (children inherit the parent's names).
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

#: Metavars of options that do not name one, by the type of their value.
DEFAULT_METAVARS: dict[type, str] = {int: "N", float: "NUMBER", Path: "PATH", str: "TEXT"}

#: ``ctx.meta`` key of the defaults applied from the environment and the config file.
_META_DEFAULTS = "placer.cli.config"

#: Valid ranges (least, most; None: no bound) of number options that declare none
#: themselves, by flag, whichever command has them: checked before any work, so a value
#: the library would refuse after reading the inputs fails at once, with its range.
OPTION_RANGES: dict[str, tuple[float | None, float | None]] = {
    "--overhead-gb": (0, None),
    "--tp": (1, None),
    "--top": (1, None),
}


def new_typer(**kwargs: Any) -> typer.Typer:
    """A Typer whose commands' groups are :class:`PlacerGroup`, plain-text help, ``-h``."""
    kwargs.setdefault("no_args_is_help", True)
    return typer.Typer(cls=PlacerGroup, rich_markup_mode=None,
                       context_settings=dict(CONTEXT_SETTINGS), **kwargs)


def examples(*lines: str, note: str = "") -> str:
    """An epilog: ``Examples:`` and the command lines as written, then ``note``."""
    text = "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
    return text + (f"\n\n{note}" if note else "")


# -- help ---------------------------------------------------------------------------------


def metavar(param: Any) -> str:
    """What stands for the value in help and usage: the declared metavar, else a plain
    word for the type (``N``, ``NUMBER``, ``PATH``, ``TEXT``), an argument's name in
    capitals; ``...`` after an argument that takes many."""
    if param.param_type_name == "argument":
        name = param.metavar or param.name.upper()
        return name if name.endswith("...") or param.nargs == 1 else f"{name}..."
    if param.metavar:
        return str(param.metavar)
    return DEFAULT_METAVARS.get(value_type(param) or str, "TEXT")


def _label(param: Any) -> str:
    """``-o, --output FILE``, ``--holdout / --no-holdout``, ``-h, --help`` or ``TRACE...``."""
    if param.param_type_name == "argument":
        return metavar(param)
    names = sorted(param.opts, key=lambda o: (o.startswith("--"), o))
    label = ", ".join(names)
    if param.secondary_opts:
        label += " / " + ", ".join(param.secondary_opts)
    if not getattr(param, "is_flag", False) and not getattr(param, "count", False):
        label += f" {metavar(param)}"
    return label


def _format_params(command: Any, ctx: Any, formatter: Any) -> None:
    """The ``Arguments:`` and ``Options:`` sections, labelled by :func:`_label`."""
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        row = (_label(param), _plain_ranges(record[1]))
        (arguments if param.param_type_name == "argument" else options).append(row)
    for title, rows in (("Arguments", arguments), ("Options", options)):
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


def _plain_ranges(text: str) -> str:
    """Typer's ``x>=1`` and ``0.0<=x<=0.999`` as ``>= 1`` and ``0.0 to 0.999``."""
    text = re.sub(r"\b(\S+)<=x<=(\S+?)(?=[;\]])", r"\1 to \2", text)
    text = re.sub(r"\bx>=(\S+?)(?=[;\]])", r">= \1", text)
    return re.sub(r"\bx<=(\S+?)(?=[;\]])", r"<= \1", text)


def _usage_pieces(command: Any, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            name = metavar(param)
            pieces.append(name if param.required else f"[{name}]")
    return pieces


# -- values -------------------------------------------------------------------------------


def value_type(param: Any) -> type | None:
    """int, float, Path or str: the type of one value of ``param`` (None: other)."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:  # typer >= 0.16
        annotation = descriptor.annotation
        args: tuple[Any, ...] = getattr(annotation, "__args__", ())
        if getattr(annotation, "__origin__", None) in (list, tuple) and len(args) == 1:
            annotation = args[0]
        if isinstance(annotation, type):
            for kind in (bool, int, float, Path, str):
                if issubclass(annotation, kind):
                    return None if kind is bool else kind
        return None
    name = getattr(getattr(param, "type", None), "name", "")  # click's types
    return {"integer": int, "integer range": int, "float": float, "float range": float,
            "path": Path, "text": str}.get(name)


def _bounds(param: Any) -> tuple[Any, Any]:
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is None and high is None:  # click's FloatRange and IntRange
        kind = getattr(param, "type", None)
        low, high = getattr(kind, "min", None), getattr(kind, "max", None)
    if low is None and high is None:
        for name in getattr(param, "opts", ()):
            low, high = OPTION_RANGES.get(name, (None, None))
            if low is not None or high is not None:
                break
    return low, high


def _range_hint(low: Any, high: Any, nearest: Any) -> str:
    """``a value from 20 to 400; the nearest valid one is 20``."""
    def shown(x: Any) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    if low is not None and high is not None:
        valid = f"from {shown(low)} to {shown(high)}"
    else:
        valid = f">= {shown(low)}" if low is not None else f"<= {shown(high)}"
    return f"a value {valid}; the nearest valid one is {shown(nearest)}"


def _out_of_range(message: str, hint: str, ctx: Any, param: Any) -> Any:
    """A BadParameter that carries placer's hint (:func:`placer_usage_error` shows it)."""
    error = BadParameter(message, ctx=ctx, param=param)
    error.placer_hint = hint
    return error


def _check_number(param: Any, ctx: Any, value: Any) -> None:
    """Raise BadParameter unless ``value`` reads as ``param``'s number type, is finite and
    within its bounds; the message says what was expected and what was given."""
    kind = value_type(param)
    if kind not in (int, float) or value is None or isinstance(value, bool):
        return
    for item in value if isinstance(value, list | tuple) else [value]:
        number = item
        if isinstance(item, str):
            try:
                number = kind(item.strip())
            except ValueError:
                words = "a whole number" if kind is int else "a number"
                raise BadParameter(f"expected {words}, got {item!r}", ctx=ctx,
                                   param=param) from None
        if not isinstance(number, int | float):
            continue
        if not math.isfinite(number):
            raise BadParameter(f"expected a finite number, got {item}", ctx=ctx, param=param)
        low, high = _bounds(param)
        if low is not None and number < low:
            raise _out_of_range(f"expected a value >= {low}, got {item}",
                                _range_hint(low, high, low), ctx, param)
        if high is not None and number > high:
            raise _out_of_range(f"expected a value <= {high}, got {item}",
                                _range_hint(low, high, high), ctx, param)


def _guard_numbers(param: Any) -> None:
    """Check a number option's values (:func:`_check_number`) before Typer converts them,
    and its converted value after (a NaN default or config value is caught too)."""
    if value_type(param) not in (int, float):
        return
    convert = param.process_value

    def process_value(ctx: Any, value: Any) -> Any:
        _check_number(param, ctx, value)
        result = convert(ctx, value)
        _check_number(param, ctx, result)
        return result

    param.process_value = process_value


# -- usage errors -------------------------------------------------------------------------


def _command_path(ctx: Any) -> str:
    return str(getattr(ctx, "command_path", "") or "placer")


def _option_names(ctx: Any) -> list[str]:
    names: list[str] = []
    if ctx is None:
        return names
    for param in ctx.command.get_params(ctx):
        if param.param_type_name == "option":
            names.extend([*param.opts, *param.secondary_opts])
    return names


def _closest(word: str, candidates: Sequence[str]) -> str | None:
    """The candidate most like ``word`` (a typo, or a prefix of one), or None."""
    prefixed = [c for c in candidates if c.startswith(word) and len(word) > 2]
    if len(prefixed) == 1:
        return prefixed[0]
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def _param_name(param: Any) -> str:
    """``--time-limit`` for an option (its longest name), ``TRACE`` for an argument."""
    if param is None:
        return ""
    if param.param_type_name == "argument":
        return metavar(param).removesuffix("...")
    return max(param.opts, key=len)


def _sentence(text: str) -> str:
    """Click's ``Got unexpected extra argument (x).`` -> ``got unexpected ... (x)``."""
    text = text.strip().rstrip(".")
    return text[:1].lower() + text[1:]


def placer_usage_error(e: Any) -> UsageError:
    """A click usage error as placer's :class:`UsageError`: what, where, and a hint
    naming the closest option or the help to read."""
    ctx = getattr(e, "ctx", None)
    path = _command_path(ctx)
    read_help = f"`{path} -h` lists the options, with examples"
    if isinstance(e, NoSuchOption):
        name = e.option_name
        best = _closest(name, _option_names(ctx))
        hint = f"did you mean {best}? ({read_help})" if best else read_help
        return UsageError("no such option", where=name, hint=hint)
    if isinstance(e, MissingParameter):
        param = e.param
        what = "argument" if getattr(param, "param_type_name", "") == "argument" else "option"
        return UsageError(f"missing: the command needs this {what}", where=_param_name(param),
                          hint=f"`{path} -h` shows what it takes, with examples")
    if isinstance(e, BadParameter):
        param = getattr(e, "param", None)
        where = _param_name(param) or getattr(e, "param_hint", None) or None
        origin = _origin(ctx, param)
        valid = getattr(e, "placer_hint", None)
        hint = f"give {valid} (`{path} -h`)" if valid else f"`{path} -h` says what it takes"
        if origin is not None:
            hint = (f"the value came from {origin.origin()}: fix it there"
                    + (f" ({valid})" if valid else "") + f", or give {where} on the command line")
        return UsageError(_sentence(e.message), where=where, hint=hint)
    if isinstance(e, BadOptionUsage):
        match = re.match(r"Option '([^']+)' (.*)", e.message)
        if match:
            message = _sentence(match.group(2)).replace("requires an argument", "needs a value")
            return UsageError(message, where=match.group(1), hint=read_help)
        return UsageError(_sentence(e.message), where=e.option_name, hint=read_help)
    message = _sentence(getattr(e, "message", str(e)))
    extra = re.match(r"got unexpected extra argument(?:s|\(s\))? \((.*)\)", message)
    if extra:
        return UsageError(f"unexpected argument(s): {extra.group(1)}",
                          hint=f"`{path} -h` shows what it takes (quote a value with spaces)")
    return UsageError(message, hint=f"`{path} -h` shows the usage")


def _origin(ctx: Any, param: Any) -> Default | None:
    """The config default a parameter's value came from, if it did."""
    if ctx is None or param is None:
        return None
    applied = ctx.meta.get(_META_DEFAULTS, {})
    default = applied.get(param.name)
    if default is None:
        return None
    source = ctx.get_parameter_source(param.name)
    return default if source is not None and source.name == "DEFAULT_MAP" else None


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Print the parser's usage errors (and config errors) in placer's form, exit 2."""
    try:
        yield
    except ClickUsageError as e:
        if NoArgsIsHelpError is not None and isinstance(e, NoArgsIsHelpError):
            raise
        fail(placer_usage_error(e))
    except PlacerError as e:
        fail(e)


# -- the classes --------------------------------------------------------------------------


#: ``yields(params) -> bool``: whether a configured default gives way, given the values
#: the command line parsed (``{name: value}``).
Yields = Callable[[dict[str, Any]], bool]


class PlacerCommand(TyperCommand):
    """A placer command: plain help, guarded numbers, defaults from the config.

    :attr:`yields` maps an option's parameter name to a :data:`Yields`: when it holds,
    a default from ``PLACER_*`` or ``placer.toml`` is dropped for the built-in one (what
    the command line gave instead outranks it)."""

    yields: ClassVar[dict[str, Yields]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _guard_numbers(param)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_params(self, ctx, formatter)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        retired = None if ctx.resilient_parsing else retired_policy(args, _option_names(ctx))
        if retired is not None:
            raise retired
        if ctx.default_map is None:
            applied = _config_defaults(self, ctx, args)
            ctx.meta[_META_DEFAULTS] = applied
            ctx.default_map = {name: _as_default(self, name, d.value)
                               for name, d in applied.items()}
        try:
            return super().parse_args(ctx, args)
        except ClickUsageError as e:
            if getattr(e, "ctx", None) is None:  # the parser's errors come without one
                e.ctx = ctx
            raise

    def invoke(self, ctx: Any) -> Any:
        applied: dict[str, Default] = ctx.meta.get(_META_DEFAULTS, {})
        by_option = {}
        for param in self.params:
            source = ctx.get_parameter_source(param.name)
            if param.name not in applied or source is None or source.name != "DEFAULT_MAP":
                continue
            rule = self.yields.get(param.name)
            if rule is not None and rule(ctx.params):
                ctx.params[param.name] = [] if param.multiple else param.default
            else:
                by_option[_param_name(param)] = applied[param.name].origin()
        token = configured_options.set(by_option)
        try:
            return super().invoke(ctx)
        finally:
            configured_options.reset(token)


def placer_command(**yields: Yields) -> type[PlacerCommand]:
    """The command class of a command whose configured defaults yield: ``name=rule``,
    the option ``name`` takes its built-in default instead of one from ``PLACER_*`` or
    ``placer.toml`` when ``rule(params)`` holds (see :func:`given`)."""
    return type("PlacerCommand", (PlacerCommand,), {"yields": yields})


def given(name: str) -> Yields:
    """The rule "when the command line gives ``name``" (not None, not empty)."""
    return lambda params: params.get(name) not in (None, [], ())


class PlacerGroup(TyperGroup):
    """A group of placer commands: plain help, usage errors in placer's form."""

    def make_context(self, info_name: Any, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        if parent is None:
            running_command.set(self)  # the flags errors are written with
        with usage_errors():
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with usage_errors():
            return super().invoke(ctx)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            best = _closest(name, [n for n, c in self.commands.items() if not c.hidden])
            listing = f"`{_command_path(ctx)} -h` lists the commands"
            raise UsageError(f"no such command {name!r}",
                             hint=f"did you mean {best}? ({listing})" if best else listing)
        return super().resolve_command(ctx, args)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage_pieces(self, ctx), self.subcommand_metavar]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _format_params(self, ctx, formatter)
        self.format_commands(ctx, formatter)


# -- defaults from the config -------------------------------------------------------------


def _config_defaults(command: Any, ctx: Any, args: list[str]) -> dict[str, Default]:
    """The config defaults (environment, file) for the options ``command`` has."""
    names = {p.name for p in command.params if p.param_type_name == "option"}
    if not names & set(SETTINGS):
        return {}
    quiet = ctx.resilient_parsing or any(a in ctx.help_option_names for a in args)
    try:
        config = load_config()
    except PlacerError:
        if quiet:  # help and completion work whatever the config says
            return {}
        raise
    return {name: d for name, d in config.defaults.items()
            if name in names and d.source != SOURCE_BUILT_IN}


def _as_default(command: Any, name: str, value: Any) -> Any:
    """A config value as the option's default: a list for options that take many."""
    for param in command.params:
        if param.name == name and (param.multiple or param.nargs == -1):
            return [value]
    return value

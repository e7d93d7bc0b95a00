"""Every entry point's command line, generated from its typed signature with jsonargparse.

``run(fn, argv, prog)`` gives each CLI the same behaviour: ``--config file.yaml`` (keys = the
signature's parameters; settings groups nest: ``windows: {stride: 4}``), flags after it override
it, ``--print_config`` prints the resolved settings, ``--help`` shows every default, and a bad
input (an unknown YAML key, a wrong type, a setting that cannot work, a missing file) is one line on
stderr naming the input and the fix, with exit status 2 and no traceback. Keep heavy imports out of
the modules that define the signatures: ``--help`` imports only them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import logging
import os
import signal
import sys
import threading
import warnings
from typing import Any, Callable

from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser, DefaultHelpFormatter

from ralm import command_name
from ralm.settings import InputError

USER_ERRORS: tuple[type[BaseException], ...] = (InputError, FileNotFoundError, NotADirectoryError,
                                                IsADirectoryError, PermissionError)


def _one_line(msg: str) -> str:
    return " ".join(str(msg).split())


def error(prog: str, msg: Any) -> int:
    """Print ``prog: error: msg`` as one line on stderr; return the exit status 2."""
    print(f"{prog}: error: {_one_line(msg)}", file=sys.stderr, flush=True)
    return 2


def help_formatter():
    """jsonargparse's help formatter, printing the description as written: example commands stay on their
    own lines (argparse would re-wrap them into one paragraph)."""
    class HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass

    return HelpFormatter


def make_parser(fn: Callable, prog: str, description: str | None = None, varargs: str | None = None):
    doc = description if description is not None else (inspect.getdoc(sys.modules[fn.__module__]) or "")
    parser = ArgumentParser(prog=prog, description=doc, exit_on_error=False, default_env=False, allow_abbrev=False,
                            formatter_class=help_formatter())
    parser.add_argument("--config", action=ActionConfigFile,
                        help="YAML file with any of the settings below; flags after it override it.")
    if varargs:  # one parameter given as positional words: ``cmd A B C`` (a list of strings) or ``cmd A``
        if "list" in str(inspect.signature(fn).parameters[varargs].annotation):
            parser.add_argument(varargs, nargs="+", type=str, metavar=varargs.upper().rstrip("S"))
        else:
            parser.add_argument(varargs, type=str, metavar=varargs.upper())
    parser.add_function_arguments(fn, as_positional=False, fail_untyped=True, skip={varargs} if varargs else None)
    return parser


def parse(fn: Callable, argv: list[str] | None, prog: str, description: str | None = None,
          varargs: str | None = None) -> dict:
    """The instantiated keyword arguments of ``fn`` from ``argv`` (raises :class:`InputError`)."""
    parser = make_parser(fn, prog, description, varargs)
    try:
        cfg = parser.parse_args(argv)
        init = (parser.instantiate if hasattr(parser, "instantiate") else parser.instantiate_classes)(cfg)
    except ArgumentError as e:
        raise InputError(f"{_one_line(e)} (see {prog} --help)") from None
    except (ValueError, TypeError) as e:  # a settings group that refused its values while being built
        cause = _input_error(e)
        if cause is None:
            raise
        raise InputError(str(cause)) from None
    return {k: v for k, v in init.items() if k != "config"}


def _input_error(e: BaseException | None) -> InputError | None:
    """The :class:`InputError` a library wrapped (jsonargparse reports a group's own check as a type error)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, InputError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def run(fn: Callable, argv: list[str] | None, prog: str, description: str | None = None,
        after: Callable[[Any, dict], Any] | None = None, varargs: str | None = None) -> int:
    """Parse ``argv`` into ``fn``'s arguments and call it (then ``after(result, kwargs)``, e.g. to print a
    table); input errors become one line and exit 2."""
    nested = next((a for a in argv or [] if a.startswith("--") and a.endswith(".help") and a.count(".") >= 2), None)
    if nested is not None and _nested_help(fn, nested, prog):
        return 0
    try:
        kwargs = parse(fn, argv, prog, description, varargs)
        out = fn(**kwargs)
        if after is not None:
            out = after(out, kwargs)
    except USER_ERRORS as e:
        return error(prog, e)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; rerun the same command to continue", file=sys.stderr)
        return 130
    finally:
        work_done(prog)
    return out if isinstance(out, int) else 0


def work_done(prog: str) -> None:
    """The command's work is over (finished, failed or stopped): a Ctrl-C or SIGTERM while the interpreter exits
    (its atexit callbacks) changes nothing but printing a traceback, so it is ignored from here on. Only where
    ``prog`` is this process's own command (not a step the pipeline runs in its process, not a test)."""
    if command_name() == prog and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _nested_help(fn: Callable, flag: str, prog: str) -> bool:
    """``--group.field.help``: the help of a settings group inside a group (e.g. ``--texts.train.help``), which
    jsonargparse lists but does not parse; False where the path names no settings class."""
    import dataclasses
    import typing

    cls: Any = fn
    for name in flag[2:].removesuffix(".help").split("."):
        hints = typing.get_type_hints(cls.__init__ if isinstance(cls, type) else cls)
        if name not in hints:
            return False
        cls = hints[name]
        while typing.get_origin(cls) is not None:  # X | None, dict[str, X], list[X]: the settings class X
            args = [a for a in typing.get_args(cls) if a is not type(None)]
            cls = args[-1] if args else cls
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return False
    parser = ArgumentParser(prog=f"{prog} {flag[:-5]}", description=inspect.getdoc(cls), formatter_class=help_formatter())
    parser.add_class_arguments(cls, flag[2:-5])
    parser.print_help()
    return True


def run_commands(commands: dict[str, Callable], argv: list[str] | None, prog: str, description: str,
                 varargs: dict[str, str] | None = None, epilog: str | None = None) -> int:
    """``prog COMMAND ...`` for a tool with several commands (``python -m ralm.models fetch NAME``): each
    command's flags come from its function's signature as in :func:`run` (``varargs`` names, per
    command, the parameter given as positional words); input errors are one line and exit 2."""
    varargs = varargs or {}
    parser = ArgumentParser(prog=prog, description=description, epilog=epilog, exit_on_error=False,
                            default_env=False, allow_abbrev=False, formatter_class=help_formatter())
    sub = parser.add_subcommands(required=True, dest="command")
    for name, fn in commands.items():
        doc = inspect.getdoc(fn) or ""
        sub.add_subcommand(name, make_parser(fn, f"{prog} {name}", doc.split("\n\n")[0], varargs.get(name)),
                           help=doc.split("\n")[0])
    try:
        try:
            cfg = parser.parse_args(argv)
        except ArgumentError as e:
            raise InputError(f"{_one_line(e)} (see {prog} --help)") from None
        name = cfg.command
        kwargs = {k: v for k, v in cfg[name].items() if k != "config"}
        out = commands[name](**kwargs)
    except USER_ERRORS as e:
        return error(prog, e)
    return out if isinstance(out, int) else 0


def run_module(module: str, argv: list[str], cwd: str | os.PathLike | None = None) -> int:
    """``python -m MODULE ARGV`` in this process: that module's ``main(argv)`` (run from ``cwd``, as a
    subprocess would be), sparing a 2-core machine the ~10-15 s of imports a new process pays. Returns the
    exit status (``reranking.fit``'s ``main`` returns its LightningCLI on success: 0)."""
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        rc = importlib.import_module(module).main(list(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    return rc if isinstance(rc, int) else 0


def quiet_libraries(verbose: bool = False) -> None:
    """Library chatter that is not the user's concern off (``verbose`` keeps it): Lightning's tips
    and duplicated INFO lines, transformers' and datasets' progress/warnings, Python warnings."""
    if verbose:
        return
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
    warnings.filterwarnings("ignore", message=".*Couldn't infer the batch indices.*")
    warnings.filterwarnings("ignore", message=".*predict_dataloader.*does not have many workers.*")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def quiet_lightning(verbose: bool = False) -> None:
    """Lightning's INFO lines (devices found, tips) off; call after importing ``lightning.pytorch``,
    whose import sets its loggers to INFO."""
    if verbose:
        return
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)

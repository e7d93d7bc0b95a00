"""The shared core: token windows, BM25 retrieval, the frozen-LM scorer and candidate selectors.

Stages (``data_gen``, ``reranking``, ``eval``) import this package; it imports none of them. Imported first by
every command, it makes a SIGTERM that comes before the command's own handling (its imports, its checks, a
retrieval stage) a clean stop: one line, exit status 143, ``with`` blocks and locks released; and a Ctrl-C that
no handler caught (during imports) one line instead of a traceback (the process then ends by SIGINT: status 130).
"""

import signal
import sys

#: The packages whose modules are the project's commands (``python -m PACKAGE.MODULE``).
COMMANDS = ("ralm", "data_gen", "reranking", "eval", "pipeline", "demo")


def command_name() -> str | None:
    """``python -m NAME`` when this process is one of the project's commands, else None (a library user's program
    keeps its own signal handling)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.split(".")[0] in COMMANDS:
        return f"python -m {spec.name.removesuffix('.__main__')}"
    return "ralm-rerank" if sys.argv and sys.argv[0].endswith("ralm-rerank") else None


def stop_on_sigterm(signum, frame) -> None:
    """SIGTERM while no other handler (Lightning's, the pipeline's) has taken over: exit 143 with one line. Where
    one composes this handler into its own, it is no longer the installed one and leaves the stop to it."""
    if signal.getsignal(signal.SIGTERM) is stop_on_sigterm:
        print(f"{command_name() or 'ralm'}: stopped by SIGTERM; what was finished is kept: rerun the same command to "
              "continue", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGTERM)


def _uncaught(kind, value, tb) -> None:
    """A command's uncaught Ctrl-C is one line; anything else is printed as Python prints it."""
    if issubclass(kind, KeyboardInterrupt):
        print(f"{command_name()}: interrupted; rerun the same command to continue", file=sys.stderr, flush=True)
    else:
        sys.__excepthook__(kind, value, tb)


if command_name():
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, stop_on_sigterm)
    sys.excepthook = _uncaught

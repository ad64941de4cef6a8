"""How the command line ends: one voice for every failure, and the exit statuses scripts rely on.

0 success; 1 an action failed (the master refused it, or could not be reached); 2 bad usage, found
before anything was sent (an unknown option, a malformed value the master would refuse by its syntax
alone); 75 `job log` printed a log its shard has not finished shipping although the entry ended
(sysexits' EX_TEMPFAIL: try again later); 124 `job wait --timeout` ran out first (as timeout(1)
does); 130 interrupted (Ctrl-C).
Every failure is one line on stderr, `Error: ...` (`interrupted` for Ctrl-C), and nothing on stdout.
A reader that left the pipe (`| head`) ends the command quietly, by SIGPIPE (141 in a shell).
"""

import os
import signal
import sys
from typing import Any, NoReturn

import click

from cli.output import printable

OK = 0
FAILED = 1
USAGE = 2
INCOMPLETE = 75
TIMED_OUT = 124
INTERRUPTED = 130


class Interrupted(click.ClickException):
    """Ctrl-C: not a failure of the action, which may well go on on the master (a job keeps running)."""

    exit_code = INTERRUPTED

    def __init__(self) -> None:
        super().__init__("interrupted")


def usage_line(exc: click.UsageError) -> str:
    """click's usage error as one line, naming the command whose --help shows the usage."""
    message = exc.format_message().rstrip(".")
    ctx = exc.ctx
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    return f"Error: {message}{where}"


def finish(exc: BaseException) -> NoReturn:
    """Prints the one line `exc` deserves and exits with its status."""
    if isinstance(exc, Interrupted):
        _say("interrupted")
        sys.exit(INTERRUPTED)
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        # A topic (or nothing) without an action: the help is the answer, not an error line.
        click.echo(exc.format_message(), err=True)
        sys.exit(USAGE)
    if isinstance(exc, click.UsageError):
        _say(usage_line(exc))
        sys.exit(USAGE)
    if isinstance(exc, click.ClickException):
        _say(f"Error: {exc.format_message()}")
        sys.exit(exc.exit_code)
    if isinstance(exc, click.Abort):
        # click turns an EOF on a prompt into Abort: nothing was typed, nothing was done.
        cause: Any = exc.__cause__ or exc.__context__
        if isinstance(cause, KeyboardInterrupt):
            _say("interrupted")
            sys.exit(INTERRUPTED)
        _say("Error: no answer on standard input")
        sys.exit(FAILED)
    raise exc


def reader_gone() -> NoReturn:
    """stdout's reader left (`fleetshard job list | head -1`): nothing to say, and nothing more to write.
    It ends as any Unix filter does there, by SIGPIPE (status 141 in a shell), so `set -o pipefail`
    scripts see what they see of `cat`. stdout points at /dev/null first, so that if the signal
    cannot end it the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    sys.exit(FAILED)


def _say(line: str) -> None:
    click.echo(printable(line), err=True)

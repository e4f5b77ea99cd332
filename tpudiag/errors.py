"""The one exception hierarchy of tpudiag, and the table that maps it to exit codes.

Every error a user can cause (a bad path, a corrupt trace, a program that fails) is a
`TpudiagError` whose `str()` is a one-line message naming the file and the problem.
`cli.main()` is the only place that turns them into an exit code.
"""

from __future__ import annotations


def one_line(e: BaseException, limit: int = 400, typed: bool = True) -> str:
    """`Type: first line of the message` (just the first line with `typed=False`; the type's name
    for an empty message), cut to `limit` characters: how a caught failure is shown in a report row
    or a manifest's reason. A first line that stops short (ends in ':' or ';': "... StableHLO
    failed;") goes on with the next lines, so the reason itself is not cut off."""
    message = str(e).strip()
    text = f"{type(e).__name__}: {message}".strip() if typed or not message else message
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()] or [type(e).__name__]
    out = lines[0]
    for ln in lines[1:]:
        if not out.endswith((":", ";")) or len(out) >= limit:
            break
        out = f"{out} {ln}"
    return out[:limit]


class TpudiagError(Exception):
    """Base class: a one-line, user-facing message."""

    exit_code = 2


class UsageError(TpudiagError):
    """The command line asked for something impossible (bad option combination)."""

    exit_code = 2


class IncompatibleVersions(TpudiagError):
    """The installed jax, jaxlib and libtpu are a combination known to crash or not to import."""

    exit_code = 2


class InputError(TpudiagError):
    """An input path is missing, empty or of the wrong kind."""

    exit_code = 2


class ParseError(TpudiagError):
    """An artifact (xplane, HLO text, manifest) is corrupt, truncated or not what was expected.

    `path` names the file; `line` (1-based) and `snippet` locate the problem when known.
    """

    exit_code = 3

    def __init__(self, path, problem: str, line: int | None = None, snippet: str | None = None):
        self.path = str(path)
        self.problem = problem
        self.line = line
        self.snippet = snippet
        where = self.path if line is None else f"{self.path}:{line}"
        msg = f"{where}: {problem}"
        if snippet:
            msg += f" (near {snippet[:60]!r})"
        super().__init__(msg)


class SchemaError(TpudiagError):
    """A DataFrame entering the analysis lacks columns or has the wrong dtypes (a bug or a bad artifact)."""

    exit_code = 4


class Terminated(BaseException):
    """tpudiag itself was stopped by SIGTERM (or SIGHUP: its terminal closed); the run it was writing
    is marked failed, and it exits 128 + the signal's number (143, 129).

    A BaseException, as KeyboardInterrupt is, and not a `TpudiagError`: code that turns a failure
    into a result (`except Exception` around a kernel case, a validate regime, jax's own fallbacks)
    must not swallow a stop. As an Exception, one SIGTERM in `tpudiag validate` was caught as a failed
    case and the command went on for 7 s more (`kernels verify`: 30 s)."""

    def __init__(self, signum: int = 15):
        import signal

        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(f"terminated by signal {signal.Signals(self.signum).name}")


class GateFailed(TpudiagError):
    """A check the user asked for did not pass (a regression past --max-regression, an HLO change
    with --fail-on-change, a kernel that failed verify or bench, modules that failed to compile).
    Not an error in tpudiag or the input: the message is the verdict, the exit code 1 unless set."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class NothingTraced(TpudiagError):
    """The program ran but the trace window selected nothing (e.g. --skip past its last step)."""

    exit_code = 2


class ProgramFailed(TpudiagError):
    """The profiled program failed; tpudiag exits with the program's own exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

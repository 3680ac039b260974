"""One exception root for the whole project.

Every error a user can cause derives from :class:`CkError`; each message
says what went wrong *and* what to change.  Catch ``CkError`` to handle
anything ck-dispatcher raises on purpose.
"""
from __future__ import annotations


class CkError(Exception):
    """Root of every deliberate ck-dispatcher error.

    ``exit_code`` is what the ``ck`` command exits with on this error (see
    :data:`EXIT_CODES`): 2 for input to fix, 3 for no kernel, 4 for a missing
    device or toolchain, 5 for a failed compile.
    """

    exit_code = 2


class PluginError(CkError):
    """A plugin failed to load, or two plugins claim the same name."""


class ConfigError(CkError):
    """A configuration file, knob, or filter expression is malformed."""


class FilterError(ConfigError):
    """A filter expression is not allowed or does not parse."""


class InvalidProblem(CkError, ValueError):
    """A problem description or its tensors are malformed (bad sizes, dtypes, shapes)."""


class UnsupportedProblem(CkError):
    """A well-formed problem that no kernel / arch / backend can handle."""

    exit_code = 3


class MissingKernel(CkError, LookupError):
    """No kernel in the registry supports the problem, or a name is unknown."""

    exit_code = 3


class CompileError(CkError):
    """Rendering or compiling a kernel failed."""

    exit_code = 5


class ToolchainMissing(CompileError):
    """A backend's compiler toolchain (hipcc, triton, a GPU) is not present."""

    exit_code = 4


class MissingDependency(ToolchainMissing, ImportError):
    """An optional dependency (torch, triton, matplotlib, ray ...) is not installed; the message
    names the extra that installs it.  Also an ImportError, so ``from x import y`` fails as usual."""


class ValidationFailed(CkError):
    """A kernel's output disagrees with the reference beyond tolerance."""

    exit_code = 1


#: the ``ck`` command's exit codes (``ck --help`` and the README print this table)
EXIT_CODES = {
    0: "success (every output validated)",
    1: "a result failed: validation FAIL, a check that did not pass",
    2: "usage: a bad flag, value, file or problem (the message says what to change)",
    3: "no kernel: the problem is unsupported or no kernel in the registry runs it",
    4: "unavailable: no GPU for the backend, or its toolchain (triton, torch, hipcc) is missing",
    5: "a kernel failed to compile (ck build: some did; --keep-going exits 0)",
    70: "internal error (a bug of ours: please report it; -vv shows the traceback)",
    130: "interrupted",
}

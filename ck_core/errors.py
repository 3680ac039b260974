"""One exception root for the whole project.

Every error a user can cause derives from :class:`CkError`; each message
says what went wrong *and* what to change.  Catch ``CkError`` to handle
anything ck-dispatcher raises on purpose.
"""
from __future__ import annotations


class CkError(Exception):
    """Root of every deliberate ck-dispatcher error."""


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


class MissingKernel(CkError, LookupError):
    """No kernel in the registry supports the problem, or a name is unknown."""


class CompileError(CkError):
    """Rendering or compiling a kernel failed."""


class ToolchainMissing(CompileError):
    """A backend's compiler toolchain (hipcc, triton, a GPU) is not present."""


class ValidationFailed(CkError):
    """A kernel's output disagrees with the reference beyond tolerance."""

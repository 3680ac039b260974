"""ck-dispatcher core: declare, enumerate, build, select, launch and check GPU kernels.

Nothing heavy is imported here (torch and triton load lazily in backends).
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import (CkError, CompileError, ConfigError, FilterError, InvalidProblem,
                     MissingKernel, PluginError, ToolchainMissing, UnsupportedProblem,
                     ValidationFailed)
from .hookspecs import hookimpl
from .key import KernelKey
from .keyspace import KeySpace
from .plugins import PluginManager, get_manager, reset_manager
from .problem import Problem
from .records import ArchSpec, BackendSpec, DemoCase, OpSpec, Plan, Stage
from .registry import Registry, enumerate_keys
from .dispatcher import Dispatcher
from .validate import Verdict, compare

__all__ = [
    "__version__", "CkError", "CompileError", "ConfigError", "FilterError", "InvalidProblem",
    "MissingKernel", "PluginError", "ToolchainMissing", "UnsupportedProblem", "ValidationFailed",
    "hookimpl", "KernelKey", "KeySpace", "PluginManager", "get_manager", "reset_manager", "Problem",
    "ArchSpec", "BackendSpec", "DemoCase", "OpSpec", "Plan", "Stage", "Registry", "enumerate_keys",
    "Dispatcher", "Verdict", "compare",
]

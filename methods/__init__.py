"""The methods: ``methods/<name>.py`` holds method ``<name>``, registered with ``@METHODS.register("<name>")``.

Importing this package imports no method: :func:`load` imports the one module a run needs (a method registered by a
plug-in, a module the config ``imports``, is found in ``METHODS`` first), :func:`load_all` every one.

Add a method: write ``methods/<name>.py`` with a ``Method`` subclass decorated by
``@METHODS.register("<name>")`` and a ``conf/method/<name>.yaml`` holding its hyperparameters.
"""

from __future__ import annotations

import importlib
import pkgutil

from bench.core.engine import METHODS, Method

__all__ = ["METHODS", "find", "load", "load_all", "names"]


def names() -> list[str]:
    """The methods of this package, from its module names (nothing is imported)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def find(name: str) -> type[Method] | None:
    """The class registered as ``name`` (importing ``methods/<name>.py`` if it is one of ours and not yet
    imported); None when neither a plug-in nor this package has it."""
    if name not in METHODS and name in names():
        importlib.import_module(f"{__name__}.{name}")
    return METHODS.get(name) if name in METHODS else None


def load(name: str) -> type[Method]:
    """The class registered as ``name``; an unknown name raises the registry's ``KeyError`` listing every method
    (ours, after importing them all, and the plug-ins')."""
    found = find(name)
    if found is None:
        load_all()
        return METHODS.get(name)
    return found


def load_all() -> list[str]:
    """Import every method of this package; the names registered after it (plug-ins' too)."""
    for name in names():
        importlib.import_module(f"{__name__}.{name}")
    return METHODS.names()

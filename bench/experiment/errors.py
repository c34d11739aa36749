"""Configuration errors on the command line: one short message on stderr and exit status 2, no traceback.

A *configuration error* is anything refused before work starts: a :class:`ConfigError`, or a ``ValueError``, an
unknown registered name (``KeyError``), an option nothing takes (``TypeError``), a missing file or a Hydra override
or config-group error raised inside :func:`config_phase` (composing and validating a config, loading a table spec,
building a run's data, partition and model), and Hydra's own errors of ``bench.experiment.run``'s command line. Whatever
fails after that (a crash inside training, a bug) keeps its traceback. ``PFL_DEBUG=1`` (or, for
``bench.experiment.run``, Hydra's ``HYDRA_FULL_ERROR=1``) shows the traceback of configuration errors too.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

from hydra.errors import HydraException, MissingConfigException, OverrideParseException

#: set to 1 to see the traceback of configuration errors
DEBUG_ENV = "PFL_DEBUG"
#: exit status of a configuration error (argparse's status for a bad command line)
CONFIG_EXIT = 2
#: the most lines of a configuration error's message shown
MAX_LINES = 4
#: what :func:`config_phase` turns into a :class:`ConfigError` (KeyError: an unknown registered name; TypeError: an
#: option a model or data source does not take)
CONFIG_CAUSES = (ValueError, KeyError, TypeError, FileNotFoundError)


class ConfigError(ValueError):
    """A configuration was refused before anything started; the message names the key, the value and the fix."""


def debugging() -> bool:
    """Whether configuration errors should show their traceback (``PFL_DEBUG=1``)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def message(err: BaseException) -> str:
    """The text of ``err`` (a KeyError's without the quotes ``str`` adds)."""
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else err
    return str(text)


@contextlib.contextmanager
def config_phase() -> Iterator[None]:
    """Re-raise the errors of a block that checks or assembles a configuration as :class:`ConfigError`."""
    try:
        yield
    except ConfigError:
        raise
    except CONFIG_CAUSES as err:
        raise ConfigError(message(err)) from err
    except HydraException as err:  # composing a config: an unknown config group choice, a bad override
        raise ConfigError(hydra_message(err)) from err


def hydra_message(err: HydraException) -> str:
    """A Hydra override or config-group error in a line or two (the choices of a config group on one line)."""
    if isinstance(err, OverrideParseException):
        return f"cannot parse the override {err.override!r}: {err.message.strip()}"
    if isinstance(err, MissingConfigException) and err.options:
        lines = str(err).strip().splitlines()
        paths = [line.split("path=", 1)[1] for line in lines if "path=" in line]
        first = lines[0].removeprefix("In 'config': ")
        return f"{first}; use one of: {', '.join(err.options)}" + (
            f"\nconfig search path: {', '.join(paths)}" if paths else "")
    text = str(err)
    if err.__cause__ is not None and str(err.__cause__) not in text:
        text += f"\n{err.__cause__}"
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("full_key:", "object_type")))


def short(text: str) -> str:
    """At most :data:`MAX_LINES` non-empty lines of ``text``."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[:MAX_LINES] + (["..."] if len(lines) > MAX_LINES else []))


def report(text: str) -> int:
    """Print a configuration error on stderr; returns :data:`CONFIG_EXIT`."""
    print(f"error: {short(text)}", file=sys.stderr, flush=True)
    return CONFIG_EXIT


def run_cli(main: Callable[[], int | None]) -> int:
    """Run a command's ``main``: a :class:`ConfigError` gives :func:`report`'s short message and exit status 2
    (unless :func:`debugging`); anything else propagates with its traceback."""
    try:
        return main() or 0
    except ConfigError as err:
        if debugging():
            raise
        return report(message(err))

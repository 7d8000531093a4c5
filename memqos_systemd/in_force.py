"""The config in force and what it makes: the unit names and the pod source, made at start and
remade in full at a reload, or not at all.

Whatever goes wrong is a ConfigError naming it, in one line: at start the service exits 2 (the
unit does not restart it: RestartPreventExitStatus=2), on a reload the old config stays in force
(issue 26: a URL the config let through killed the daemon on reload, then at every restart).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from . import features
from .config import ConfigError, load_config
from .config_schema import Config
from .naming import Naming, NamingError
from .pods import one_line

__all__ = ["InForce", "made_from", "reloaded", "unexpected"]


class InForce(NamedTuple):
    config: Config
    naming: Naming
    source: Any  # the pod source (sources/)


def unexpected(error: BaseException) -> str:
    """An exception of no type of ours, for one log line: its type says what broke."""
    return f"{type(error).__name__}: {one_line(str(error), 300)}"


def made_from(config: Config, path: str | None, make_source: Callable[[Config], Any],
              previous: tuple[Config, Any] | None = None) -> tuple[Naming, Any]:
    """The unit names and the pod source a config makes (`previous`: the config in force and its
    source, kept when the new config has the same one); a ConfigError when they cannot be made."""
    try:
        naming = Naming.for_config(config)
        if previous is not None and (config.pods_file, config.kubelet) == (previous[0].pods_file, previous[0].kubelet):
            return naming, previous[1]
        return naming, make_source(config)
    except ConfigError:
        raise
    except NamingError as e:
        raise ConfigError(f"{path or 'the config'}: {e}") from None
    except Exception as e:  # whatever a source's constructor raises
        raise ConfigError(f"{path or 'the config'}: {unexpected(e)}") from None


def reloaded(path: str | None, make_source: Callable[[Config], Any], previous: tuple[Config, Any]) -> InForce:
    """The config at `path` (required when given) and what it makes, every part made before any
    is used; a ConfigError in one line, whatever went wrong (the old config then stays in force)."""
    try:
        config = load_config(path, required=path is not None, blocks=features.config_blocks())
        return InForce(config, *made_from(config, path, make_source, previous=previous))
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(unexpected(e)) from None

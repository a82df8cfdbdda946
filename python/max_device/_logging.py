"""The loader's log: spdlog on stderr, prefixed ``[max_device]``.

Set the level with ``set_log_level`` or the environment variable
``MAX_DEVICE_LOG_LEVEL`` (trace, debug, info, warn, error, off).
"""

from . import _C


def set_log_level(level: str) -> None:
    _C._set_log_level(level)


def log_level() -> str:
    return _C._log_level()

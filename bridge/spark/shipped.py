"""The configuration as Spark tasks get it: the YAML text the driver read, sent with the tasks.

Executors need not find the file: on a cluster it is not where the driver read it, and a file
given with `spark-submit --files` reaches the executors' working folders under another name.
`${VAR}` references in the text are expanded on each executor from its own environment
(`spark.executorEnv.VAR`), so no secret travels inside a task.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from bridge.config.load import load_config_text
from bridge.config.model import BridgeConfig


@dataclass(frozen=True)
class ShippedConfig:
    """`text` as read from `path` on the driver (problems name that path; relative SQLite
    paths are resolved against its folder)."""

    path: str
    text: str

    @classmethod
    def read(cls, path: str) -> ShippedConfig:
        with open(path, encoding="utf-8") as handle:
            return cls(path, handle.read())

    def load(self) -> BridgeConfig:
        """The configuration, validated in this process (once per Python worker, which Spark
        reuses for many tasks). Raises ConfigError, and UnsetVariables for a variable of any
        database that the executor's environment lacks: a task does the daemon's work, which
        would otherwise count a database it cannot open as one that is down."""
        return _load(self.path, self.text)


@functools.lru_cache(maxsize=4)
def _load(path: str, text: str) -> BridgeConfig:
    config, _ = load_config_text(text, path)
    config.require_environment("spark", config.databases)
    return config

"""The configuration a verb works with: the file `-c` names, read when the verb needs it (`demo`
needs none)."""

from __future__ import annotations

import argparse
import logging

from bridge.config import BridgeConfig, load_config
from bridge.daemon.observability import setup_logging

log = logging.getLogger("sfbridge")


def load(args: argparse.Namespace) -> BridgeConfig:
    """The configuration at `args.config`, its warnings logged and its logging level set.
    Raises ConfigError."""
    config = load_path(args.config)
    setup_logging(config.logging.level, verbose=args.verbose, log_format=config.logging.format)
    return config


def load_path(path: str) -> BridgeConfig:
    """The configuration at `path`, its warnings logged. Raises ConfigError."""
    config, warnings = load_config(path)
    for warning in warnings:
        log.warning("config: %s", warning)
    return config

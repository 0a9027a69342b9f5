"""Starting Spark for sfbridge, or saying exactly what is missing."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from typing import Any


class SparkUnavailable(Exception):
    """PySpark or Java is missing; the message says what to install."""


def spark_session(master: str, app_name: str) -> Any:
    """A SparkSession for `master` (`local[*]`, `local[2,3]`, `yarn`, `k8s://...`).

    Local masters bind to loopback and run tasks with this interpreter (which has sfbridge);
    on a cluster, set `spark.pyspark.python` to the shipped environment's interpreter.
    Speculative execution is always off: a speculative copy of a drain task would only
    compete for the same rows. Raises SparkUnavailable.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable(
            "PySpark is not installed: pip install 'sfbridge[spark]' (PySpark 4 needs Java 17 "
            "or later too)"
        ) from None
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) and not (
        shutil.which("java")
    ):
        raise SparkUnavailable(
            "Spark needs Java 17 or later and none was found: install it (Debian: apt-get "
            "install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.speculation", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if local:
        builder = builder.config("spark.ui.enabled", "false")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    # py4j logs every closed gateway connection at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return session

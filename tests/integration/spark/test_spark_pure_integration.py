"""The Spark edge's pure parts: splitting a queue into ranges, the report's rows and its HTML.
(The drain, reconcile and report themselves run on a real local Spark in
tests/integration/spark/test_spark.py.)"""

from __future__ import annotations

import sys


def test_the_daemon_and_the_cli_never_import_pyspark() -> None:
    import subprocess

    code = (
        "import sys, bridge.commands.cli, bridge.daemon.runtime, bridge.forwarding.spine; "
        "bridge.commands.cli.build_parser(); "
        "print('pyspark' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


# -- Spark settings and failures ----------------------------------------------------------

"""Bulk work on Apache Spark (PySpark, an optional extra): drain, reconcile, report.

Spark is an edge like the daemon and the CLI: every Spark task runs the daemon's own data path
(`bridge.forwarding.spine.BatchForwarder`) over its share of a forwarding queue. Nothing outside
this package imports PySpark; `bridge.spark.session` says what to install when it is missing.
"""

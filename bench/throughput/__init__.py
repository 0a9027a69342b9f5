"""The forwarding throughput benchmark's parts; `bench/forwarding_benchmark.py` runs them.

- `databases`: fresh PostgreSQL databases and SQLite files, queue tables in each transport's
  shape, prefill, counts and the exactly-once check;
- `baselines`: the server-side ceiling and the naive per-message relay;
- `daemon`: `sfbridge run` in a subprocess, timed, with its CPU time and peak RSS;
- `scenarios`: the rows of one scenario, repeated and checked;
- `latency`: idle pickup latency and idle CPU;
- `report`: the tables and the JSON.
"""

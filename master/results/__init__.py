"""Benchmark results (docs/design.md, "Benchmark results"): parsing result files, storing them, querying
them and finding regressions.

`formats` and `changepoint` are pure Python, usable from the master's services, the shard's uploader
and the benchmarks alike; `models`, `ingest`, `queries` and `regressions` are the master's storage.
"""

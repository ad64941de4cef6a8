"""Benchmark results (DESIGN.md, "Benchmark results"): parsing result files and finding regressions.

Pure Python: nothing here touches the database, so the parsers and the detector are usable from the
master's services, the shard's uploader and the benchmarks alike.
"""

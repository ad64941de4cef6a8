"""Elastic workers (docs/design.md, "Elastic workers"): the worker manager's policy, its backends and its loop."""

"""Elastic workers (DESIGN.md, "Elastic workers"): the worker manager's policy, its backends and its loop."""

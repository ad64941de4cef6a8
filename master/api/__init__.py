"""The master's REST API under /api/v1/: thin views over master.services."""

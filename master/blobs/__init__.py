"""Blobs on the master: job inputs people upload and outputs shards bring back (docs/blobs.md)."""

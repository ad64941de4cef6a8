"""The master's admin: labels, hosts, shards, jobs and tokens, for the fleet's operators.

Every change goes through master.services, the same functions the API and the CLI call, so the
admin follows the same rules and shows the same error messages. That is why object pages are
read-only and the built-in add and delete are replaced: a plain model save would skip the version
bump that tells shards about a change, and the assignment rules that keep a host on one shard.
Changelists load everything a row shows in a fixed number of queries, whatever the page size.

Django's autodiscovery imports this package; importing the topic modules registers their pages.
"""

from master.admin import audit, hosts, jobs, labels, notify, results, shards, site, tokens, users

__all__ = ["audit", "hosts", "jobs", "labels", "notify", "results", "shards", "site", "tokens", "users"]

"""The master's domain changes, one module per domain. Each change is one transaction that takes a
keyword-only `acting_user` (None: the system itself) and writes its audit record (master.access.audit).

A change a shard must see raises the record's `version`, so the next heartbeat re-sends it.
"""

from master.services.hosts import create_hosts, delete_hosts, lock_hosts, set_host_attributes, unlock_hosts
from master.services.jobs import JobRequest, abort_jobs, create_job, max_hqes_per_job, merge_meta_hosts, rerun_job
from master.services.labels import (
    HostsChange,
    add_label_to_hosts,
    create_labels,
    delete_labels,
    remove_label_from_hosts,
)
from master.services.shards import (
    ShardChange,
    ShardDeletion,
    add_labels_to_shard,
    create_shard,
    delete_shards,
    remove_label_from_shard,
)
from master.services.shared import (
    KEY_RULE,
    NAME_RULE,
    HostMove,
    describe_moves,
    get_hosts,
    get_labels,
    get_shard,
    valid_name,
)
from master.services.tokens import create_personal_token, create_shard_token, revoke_token, set_password

__all__ = [
    "KEY_RULE",
    "NAME_RULE",
    "HostMove",
    "HostsChange",
    "JobRequest",
    "ShardChange",
    "ShardDeletion",
    "abort_jobs",
    "add_label_to_hosts",
    "add_labels_to_shard",
    "create_hosts",
    "create_job",
    "create_labels",
    "create_personal_token",
    "create_shard",
    "create_shard_token",
    "delete_hosts",
    "delete_labels",
    "delete_shards",
    "describe_moves",
    "get_hosts",
    "get_labels",
    "get_shard",
    "lock_hosts",
    "max_hqes_per_job",
    "merge_meta_hosts",
    "remove_label_from_hosts",
    "remove_label_from_shard",
    "rerun_job",
    "revoke_token",
    "set_host_attributes",
    "set_password",
    "unlock_hosts",
    "valid_name",
]

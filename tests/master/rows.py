"""A fleet that grows one row of each kind at a time, for the tests that pin query counts."""

from master import services


def add_rows(start: int, count: int) -> None:
    """Rows start..start+count-1 of each kind, with every relation a list page shows.

    Each row is a label owned by its own shard (which brings a shard token), a host with that label,
    locked every other row, and a job on it that also depends on the label; every other row adds a
    personal token too, so the token list shows both kinds of owner.
    """
    for i in range(start, start + count):
        label, hostname = f"board:{i}", f"dut{i:03}"
        services.create_labels([label], acting_user=None)
        services.create_shard(f"lab{i:03}", [label], acting_user=None)
        services.create_hosts([hostname], labels=[label], acting_user=None)
        req = services.JobRequest(
            name=f"job{i}", owner="ana", command="true", meta_hosts=[(label, 1)], dependency_labels=[label]
        )
        services.create_job(req, acting_user=None)
        if i % 2:
            services.lock_hosts([hostname], "maintenance", acting_user=None)
            services.create_personal_token(f"user{i}", acting_user=None)

"""A quiet heartbeat reads its shard's hosts (id, version, status) and active jobs (id, version,
priority) from an index alone on PostgreSQL. A shard's rows lie wherever they were written (a million
hosts bulk-loaded a shard at a time in turn put each of a shard's 200 hosts on its own page), and
reading them from the table took 258 pages a heartbeat at 1,000,000 hosts against 13 from these
(docs/benchmarks.md). Each new index is built before the one it replaces is dropped. SQLite has no
INCLUDE: there they stay the plain indexes they were."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("common", "0013_shard_seq_seen"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="host",
            index=models.Index(fields=["shard", "id"], include=("version", "status"), name="host_shard_holdings_idx"),
        ),
        migrations.RemoveIndex(model_name="host", name="host_shard_idx"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                fields=["shard", "status"], include=("id", "version", "priority"), name="job_shard_holdings_idx"
            ),
        ),
        migrations.RemoveIndex(model_name="job", name="job_shard_status_idx"),
    ]

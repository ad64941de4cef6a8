"""The scheduler's bookkeeping leaves common: a host's runner, failed repair version and retirement, and an
HQE's runner, pid and results directory now live in shard's HostState and Run (shard's 0002).

On a shard, shard's 0002 runs first and copies the values into its tables. The master never set these
columns (the shard app is not installed there), so they are dropped on both roles.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("common", "0004_role_models")]

    operations = [
        migrations.RemoveField(model_name="host", name="repair_failed_version"),
        migrations.RemoveField(model_name="host", name="retired"),
        migrations.RemoveField(model_name="host", name="runner"),
        migrations.RemoveField(model_name="hostqueueentry", name="pid"),
        migrations.RemoveField(model_name="hostqueueentry", name="results_dir"),
        migrations.RemoveField(model_name="hostqueueentry", name="runner"),
    ]

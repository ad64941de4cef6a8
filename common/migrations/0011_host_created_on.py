from datetime import UTC, datetime

from django.db import migrations, models
from django.utils import timezone

# Hosts made before this migration: their creation is unknown, so they count as old (a timeline window's
# whole length, as before); hosts made after it count from their creation (the model's default).
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


class Migration(migrations.Migration):
    dependencies = [
        ("common", "0010_job_rerun_of"),
    ]

    operations = [
        migrations.AddField(
            model_name="host",
            name="created_on",
            field=models.DateTimeField(default=LONG_AGO),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="host",
            name="created_on",
            field=models.DateTimeField(default=timezone.now),
        ),
    ]

"""Prometheus metrics for the fleet, read from the database at each scrape.

Reading the database (rather than counting in process memory) keeps the figures right whatever
gunicorn worker answers, and costs three queries however big the fleet is.
"""

import json
from collections.abc import Iterator
from typing import Any

from django.db.models import Count
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from common.models import Host, Job, Shard


class FleetCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = GaugeMetricFamily(
            "fleetshard_shard_up", "1 if the shard heartbeated within three intervals", labels=["shard"]
        )
        last = GaugeMetricFamily(
            "fleetshard_shard_last_heartbeat_timestamp_seconds", "When the shard last heartbeated", labels=["shard"]
        )
        applied = CounterMetricFamily(
            "fleetshard_shard_updates_applied", "HQE updates from the shard applied by the master", labels=["shard"]
        )
        names: dict[int | None, str] = {None: ""}
        for shard in Shard.objects.all():
            names[shard.id] = shard.hostname
            up.add_metric([shard.hostname], 1 if shard.is_online() else 0)
            if shard.last_heartbeat is not None:
                last.add_metric([shard.hostname], shard.last_heartbeat.timestamp())
            applied.add_metric([shard.hostname], shard.updates_applied)
        yield from (up, last, applied)

        hosts = GaugeMetricFamily(
            "fleetshard_hosts", "Hosts by shard, status and lock", labels=["shard", "status", "locked"]
        )
        for row in Host.objects.values("shard_id", "status", "locked").annotate(n=Count("id")).order_by():
            hosts.add_metric([names.get(row["shard_id"], ""), row["status"], str(row["locked"]).lower()], row["n"])
        yield hosts

        jobs = GaugeMetricFamily("fleetshard_jobs", "Jobs by shard and status", labels=["shard", "status"])
        for job_row in Job.objects.values("shard_id", "status").annotate(n=Count("id")).order_by():
            jobs.add_metric([names.get(job_row["shard_id"], ""), job_row["status"]], job_row["n"])
        yield jobs


class NotifyCollector(Collector):
    """Notification deliveries by event and outcome, and how long the oldest undelivered event waits."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from master.notify.models import Delivery
        from master.notify.sender import oldest_undelivered_s

        deliveries = GaugeMetricFamily(
            "fleetshard_notify_deliveries",
            "Notification deliveries kept, by event and outcome",
            labels=["event", "outcome"],
        )
        rows = Delivery.objects.values("event__kind", "status").annotate(n=Count("id")).order_by()
        for row in rows:
            deliveries.add_metric([row["event__kind"], row["status"]], row["n"])
        yield deliveries
        yield GaugeMetricFamily(
            "fleetshard_notify_oldest_undelivered_seconds",
            "Age of the oldest notification event not yet delivered (0 when none waits)",
            value=oldest_undelivered_s(),
        )


class PrometheusTextRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return data if isinstance(data, bytes) else json.dumps(data).encode()


class MetricsView(APIView):
    """Any signed-in person (token or login) may scrape; Prometheus sends a token as a bearer."""

    renderer_classes = [PrometheusTextRenderer]

    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FleetCollector())
        registry.register(NotifyCollector())
        return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

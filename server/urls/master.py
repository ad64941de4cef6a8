from django.contrib import admin
from django.urls import include, path

from common.health import healthz, readyz
from master.observe.metrics import MetricsView
from master.observe.overview import fleet_overview
from master.results import charts
from master.sync.endpoint import heartbeat, heartbeat_wait

urlpatterns = [
    path("admin/fleet/", admin.site.admin_view(fleet_overview), name="fleet-overview"),
    path("admin/benchmarks/", admin.site.admin_view(charts.tests_page), name="benchmarks"),
    path("admin/benchmarks/entries/", admin.site.admin_view(charts.entries_page), name="benchmarks-entries"),
    path("admin/benchmarks/chart/", admin.site.admin_view(charts.chart_page), name="benchmarks-chart"),
    path("admin/benchmarks/compare/", admin.site.admin_view(charts.compare_page), name="benchmarks-compare"),
    path("api/v1/heartbeat", heartbeat, name="heartbeat"),
    path("api/v1/heartbeat/wait", heartbeat_wait, name="heartbeat-wait"),
    path("api/v1/", include("master.api.urls")),
    path("admin/", admin.site.urls),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
]

# Django's own 400s (e.g. a refused Host header) as JSON under /api/.
handler400 = "master.api.errors.bad_request"

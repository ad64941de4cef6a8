from django.contrib import admin
from django.urls import include, path

from master.metrics import MetricsView
from master.overview import fleet_overview
from master.views import heartbeat

urlpatterns = [
    path("admin/fleet/", admin.site.admin_view(fleet_overview), name="fleet-overview"),
    path("api/v1/heartbeat", heartbeat, name="heartbeat"),
    path("api/v1/", include("master.api.urls")),
    path("admin/", admin.site.urls),
    path("metrics", MetricsView.as_view(), name="metrics"),
]

# Django's own 400s (e.g. a refused Host header) as JSON under /api/.
handler400 = "master.api_errors.bad_request"

"""Routes of /api/v1/. A SimpleRouter: the DefaultRouter's format suffixes would swallow dotted hostnames."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from master.api import blobs, logs, notify, results, root, timeline, views
from master.api.permissions import ApiDocsPermission

router = SimpleRouter()
router.register("labels", views.LabelViewSet, basename="label")
router.register("hosts", views.HostViewSet, basename="host")
router.register("shards", views.ShardViewSet, basename="shard")
router.register("jobs", views.JobViewSet, basename="job")
router.register("audit", views.AuditViewSet, basename="audit")
router.register("tokens", views.TokenViewSet, basename="token")
router.register("results/tests", results.ResultTestViewSet, basename="result-test")
router.register("results/runs", results.ResultRunViewSet, basename="result-run")
router.register("results/timings", results.TimingViewSet, basename="result-timing")
router.register("results/regressions", results.RegressionViewSet, basename="result-regression")
router.register("notifications", notify.SubscriptionViewSet, basename="notification")

urlpatterns = [
    path("", root.ApiRootView.as_view(), name="api-root"),
    path("schema/", SpectacularAPIView.as_view(permission_classes=[ApiDocsPermission]), name="schema"),
    path(
        "docs/",
        SpectacularSwaggerView.as_view(url_name="schema", permission_classes=[ApiDocsPermission]),
        name="docs",
    ),
    path("auth/", include("rest_framework.urls")),
    path("results/upload", results.ResultUploadView.as_view(), name="results-upload"),
    path("results/quarantined", results.ResultQuarantinedView.as_view(), name="results-quarantined"),
    path("results/compare", results.CompareView.as_view(), name="results-compare"),
    path("blobs/<str:digest>", blobs.BlobView.as_view(), name="blob"),
    path("artifacts", blobs.ArtifactsReportView.as_view(), name="artifacts-report"),
    path("jobs/<str:id>/artifacts", blobs.JobArtifactsView.as_view(), name="job-artifacts"),
    path("logs/append", logs.LogAppendView.as_view(), name="logs-append"),
    path("jobs/<str:id>/log", logs.JobLogView.as_view(), name="job-log"),
    path("timeline/export", timeline.TimelineExportView.as_view(), name="timeline-export"),
    path("timeline/stats", timeline.TimelineStatsView.as_view(), name="timeline-stats"),
    path("timeline/trace", timeline.TimelineTraceView.as_view(), name="timeline-trace"),
    path("whoami/", views.WhoAmIView.as_view(), name="whoami"),
    path("", include(router.urls)),
]

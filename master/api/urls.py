"""Routes of /api/v1/. A SimpleRouter: the DefaultRouter's format suffixes would swallow dotted hostnames."""

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from master.api import views

router = SimpleRouter()
router.register("labels", views.LabelViewSet, basename="label")
router.register("hosts", views.HostViewSet, basename="host")
router.register("shards", views.ShardViewSet, basename="shard")
router.register("jobs", views.JobViewSet, basename="job")
router.register("audit", views.AuditViewSet, basename="audit")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("auth/", include("rest_framework.urls")),
    path("", include(router.urls)),
]

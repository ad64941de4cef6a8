from django.urls import path

from common.health import healthz, readyz
from shard.admin import shard_site

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("admin/", shard_site.urls),
]

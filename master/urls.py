from django.contrib import admin
from django.urls import include, path

from master.views import heartbeat

urlpatterns = [
    path("api/v1/heartbeat", heartbeat, name="heartbeat"),
    path("api/v1/", include("master.api.urls")),
    path("admin/", admin.site.urls),
]

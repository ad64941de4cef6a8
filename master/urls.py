from django.contrib import admin
from django.urls import path

from master.views import heartbeat

urlpatterns = [
    path("api/v1/heartbeat", heartbeat, name="heartbeat"),
    path("admin/", admin.site.urls),
]

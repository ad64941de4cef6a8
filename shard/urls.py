from django.urls import path

from shard.admin import shard_site

urlpatterns = [
    path("admin/", shard_site.urls),
]

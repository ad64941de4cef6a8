"""The admin site's titles, front page and "View site" link."""

from django.contrib import admin
from django.urls import reverse_lazy

admin.site.site_header = "fleetshard master"
admin.site.site_title = "fleetshard master"
admin.site.index_title = "Fleet administration"
admin.site.index_template = "master/admin/index.html"
# The header's "View site" link; a lazy URL works where the stubs say str.
admin.site.site_url = reverse_lazy("fleet-overview")  # type: ignore[assignment]
# The navigation sidebar repeats the front page and takes a quarter of a 1400 px window from the lists.
admin.site.enable_nav_sidebar = False

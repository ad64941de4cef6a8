from django.apps import AppConfig


class ServerConfig(AppConfig):
    """The Django project as an app of its own, with no models: for its `serve` command and deploy checks."""

    name = "server"
    verbose_name = "fleetshard server"

    def ready(self) -> None:
        from server import checks  # noqa: F401  (registers the deploy checks)

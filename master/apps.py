from django.apps import AppConfig


class MasterConfig(AppConfig):
    name = "master"
    verbose_name = "fleetshard master"

    def ready(self) -> None:
        # Connects the signal handlers that empty every process's token cache when a token, a user or a
        # shard changes, in every process that may change one (the admin, the API, the commands).
        from master.sync import notifier  # noqa: F401

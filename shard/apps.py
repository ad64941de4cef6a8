from django.apps import AppConfig


class ShardConfig(AppConfig):
    name = "shard"
    verbose_name = "fleetshard shard"

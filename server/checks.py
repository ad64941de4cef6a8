"""`manage.py check --deploy` checks of fleetshard's own: Django's cannot tell its development key."""

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.security, deploy=True)
def secret_key_is_not_the_development_key(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    if settings.SECRET_KEY != settings.DEV_SECRET_KEY:
        return []
    return [
        Error(
            "SECRET_KEY is fleetshard's published development key.",
            hint="Set SECRET_KEY in the role's environment file to a long random value "
            "(python3 -c 'import secrets; print(secrets.token_urlsafe(50))').",
            id="fleetshard.E001",
        )
    ]

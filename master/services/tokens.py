"""API tokens: a person's (creating the user if missing) or a shard's, and revoking them."""

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from common.errors import FleetshardError, NotFound
from master.access.audit import ActingUser, record
from master.access.credentials import issue_token
from master.models import Token
from master.services.shared import get_shard
from master.sync.notifier import shards_changed

# Enough for any passphrase; bounded, as every input is.
MAX_PASSWORD_CHARS = 1024


@transaction.atomic
def create_personal_token(
    username: str, *, acting_user: ActingUser, admin: bool = False, description: str = ""
) -> tuple[Token, str]:
    """Creates the user if missing (staff and superuser with admin) and a new token, returned once."""
    if not username or len(username) > 150:
        raise FleetshardError("a username needs 1-150 characters", field="username")
    user, created = get_user_model().objects.get_or_create(username=username)
    made_admin = admin and not (user.is_staff and user.is_superuser)
    if made_admin:
        user.is_staff = user.is_superuser = True
        user.save(update_fields=["is_staff", "is_superuser"])
    token, raw = issue_token(user=user, description=description or f"personal token of {username}")
    record(
        "token.create",
        acting_user=acting_user,
        targets=[token, user],
        details={"description": token.description, "user_created": created, "made_admin": made_admin},
    )
    return token, raw


@transaction.atomic
def set_password(username: str, password: str, *, acting_user: ActingUser) -> None:
    """Gives an existing user a password for the admin's login page (a token is for the API only).
    The password must pass the site's validators; it is stored hashed, and the audit names the user only."""
    if not username or len(username) > 150 or _unencodable(username):
        raise FleetshardError(f"invalid username {username[:40]!r}", field="username")
    user = get_user_model().objects.select_for_update().filter(username=username).first()
    if user is None:
        raise NotFound(
            f"unknown user {username!r}: `manage.py create_token {username} --admin` makes one", field="username"
        )
    if not password.strip() or len(password) > MAX_PASSWORD_CHARS or _unencodable(password):
        # A surrogate is a byte that was not UTF-8 (the terminal's or the file's encoding): hashing it failed.
        raise FleetshardError(
            f"a password needs 1-{MAX_PASSWORD_CHARS} characters, not only spaces, no NUL and valid UTF-8",
            field="password",
        )
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise FleetshardError("password: " + " ".join(exc.messages), field="password") from None
    user.set_password(password)
    user.save(update_fields=["password"])
    record("user.set_password", acting_user=acting_user, targets=[user])


def _unencodable(text: str) -> bool:
    return any(c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF for c in text)


@transaction.atomic
def create_shard_token(hostname: str, *, acting_user: ActingUser, description: str = "") -> tuple[Token, str]:
    """Another heartbeat token for a shard (to rotate one: create, deploy, then revoke the old)."""
    shard = get_shard(hostname)
    token, raw = issue_token(shard=shard, description=(description or f"heartbeat token of {hostname}")[:255])
    record("token.create", acting_user=acting_user, targets=[token, shard], details={"description": token.description})
    return token, raw


@transaction.atomic
def revoke_token(token_id: int, *, acting_user: ActingUser) -> None:
    token = Token.objects.select_related("user", "shard").filter(id=token_id).first()
    if token is None:
        raise NotFound(f"unknown token {token_id}", field="id")
    record(
        "token.revoke",
        acting_user=acting_user,
        targets=[token, *(o for o in (token.user, token.shard) if o is not None)],
        details={"description": token.description},
    )
    # A wait held with this token ends, so its holder learns of the revocation by its next heartbeat.
    shards_changed([token.shard_id])
    token.delete()

"""`fleetshard token ...` (API tokens, for admins) and `fleetshard whoami`."""

import click

from cli.action import Run, action
from cli.client import CliError
from cli.inputs import Id
from cli.output import Column, fields, when

TOKEN_COLUMNS: list[Column] = [
    ("Id", "id"),
    ("Token", lambda t: f"{t['prefix']}…"),
    ("For", lambda t: f"shard {t['shard']}" if t["kind"] == "shard" else f"user {t['user']}"),
    ("Description", "description"),
    ("Created", when("created_on")),
    ("Last used", when("last_used")),
]


@click.group()
def token() -> None:
    """API tokens: personal ones (the REST API) and shards' (the heartbeat). For admins."""


@token.command("list")
@action
def token_list(run: Run) -> None:
    """List tokens (their first characters: the master keeps only a digest), newest first."""
    tokens = run.api.list("/tokens/")
    run.rows(tokens, TOKEN_COLUMNS, "tokens")


@token.command("create")
@click.option("--shard", metavar="NAME", help="Another heartbeat token for shard NAME (to rotate its token).")
@click.option("-d", "--description", default="", metavar="TEXT", help="What the token is for.")
@action
def token_create(run: Run, shard: str | None, description: str) -> None:
    """Create a personal token for yourself, or with --shard a heartbeat token; printed once."""
    obj = run.api.post("/tokens/", {"shard": shard, "description": description})
    whose = f"shard {obj['shard']} (FLEETSHARD_SHARD_TOKEN)" if shard else f"user {obj['user']}"
    run.done(obj, f"Created token {obj['id']} for {whose}, shown only this once:\n{obj['token']}")


@token.command("revoke")
@click.argument("token_ids", metavar="ID...", nargs=-1, required=True, type=Id("token"))
@action
def token_revoke(run: Run, token_ids: tuple[int, ...]) -> None:
    """Revoke tokens: requests with them are refused from now on."""
    wanted = list(dict.fromkeys(token_ids))
    for i, token_id in enumerate(wanted):
        try:
            run.api.request("DELETE", f"/tokens/{token_id}/")
        except CliError as exc:
            if i:  # one request per token: say which went before the failure
                raise CliError(f"{exc.message} (revoked before it: {', '.join(map(str, wanted[:i]))})") from None
            raise
    run.done({"revoked": wanted}, f"Revoked tokens: {', '.join(map(str, wanted))}")


@click.command("whoami")
@action
def whoami(run: Run) -> None:
    """Who your token speaks for, and whether it makes you staff."""
    obj = run.api.get("/whoami/")
    roles = [r for r, on in (("staff", obj["is_staff"]), ("superuser", obj["is_superuser"])) if on]
    tok = (obj.get("tokens") or [{}])[0]
    shown = {
        "username": obj["username"],
        "roles": ", ".join(roles) or "none",
        "token": f"{tok['prefix']}… (id {tok['id']}, {tok['description'] or 'no description'})" if tok else None,
        "created": when("created_on")(tok) if tok else None,
        "last_used": when("last_used")(tok) if tok else None,
    }
    keys = [("User", "username"), ("Roles", "roles"), ("Token", "token"), ("Created", "created")]
    keys.append(("Last used", "last_used"))
    run.done(obj, fields(shown, keys))

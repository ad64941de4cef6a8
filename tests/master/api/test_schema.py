"""The committed OpenAPI schema is the code's schema, and the docs page works offline."""

import re

import yaml
from django.core.management import call_command

from tests.master.api.conftest import SCHEMA_PATH
from tests.support import assert_status


def test_committed_schema_matches_the_code(tmp_path):
    generated = tmp_path / "openapi.yaml"
    call_command("spectacular", "--file", str(generated), "--validate", "--fail-on-warn")
    assert generated.read_text() == SCHEMA_PATH.read_text(), (
        "docs/openapi.yaml is stale: regenerate it with "
        "`FLEETSHARD_ROLE=master python manage.py spectacular --validate --file docs/openapi.yaml`"
    )


def test_schema_is_served_to_a_token(user):
    resp = user.get("/api/v1/schema/")
    assert_status(resp, 200)
    assert yaml.safe_load(resp.content) == yaml.safe_load(SCHEMA_PATH.read_text())


def test_schema_and_docs_need_a_token_like_the_api(anonymous):
    for page in ("/api/v1/schema/", "/api/v1/docs/"):
        assert anonymous.get(page).status_code in (401, 403), page


def test_schema_and_docs_are_public_when_the_operator_opens_them(anonymous, settings):
    settings.FLEETSHARD_PUBLIC_API_DOCS = True
    resp = anonymous.get("/api/v1/schema/")
    assert_status(resp, 200)
    assert yaml.safe_load(resp.content) == yaml.safe_load(SCHEMA_PATH.read_text())
    assert_status(anonymous.get("/api/v1/docs/"), 200)


def test_docs_page_and_its_assets_are_served_locally(user, anonymous):
    resp = user.get("/api/v1/docs/")
    assert_status(resp, 200)
    page = resp.content.decode()
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page)
    assert any("swagger-ui-bundle.js" in a for a in assets), page
    for asset in assets:
        assert_status(anonymous.get(asset), 200)
    assert "http://" not in page.replace("http://testserver", "") and "https://" not in page


def test_api_root_reports_the_one_version(user, anonymous):
    from common.constants import CLIENT_VERSION, PROTOCOL_VERSION

    assert user.get("/api/v1/").json() == {"version": CLIENT_VERSION, "protocol": PROTOCOL_VERSION}
    assert anonymous.get("/api/v1/").status_code in (401, 403)

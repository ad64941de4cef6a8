"""Production settings: `check --deploy` is clean behind a TLS proxy, and `serve` sizes itself."""

import os
import secrets

import pytest
import requests
from django.core.management.base import CommandError

from common.management.commands.serve import default_threads, default_workers
from tests.support import Role, free_port, stop, wait_until


def role(name: str, tmp_path, **env: str) -> Role:
    one = Role(name, f"sqlite:///{tmp_path / 'x.sqlite3'}", tmp_path)
    one.extra_env.update({"SECRET_KEY": secrets.token_urlsafe(50), **env})
    return one


@pytest.mark.parametrize("name", ["master", "shard"])
def test_check_deploy_is_clean_behind_a_tls_proxy(name, tmp_path):
    proc = role(name, tmp_path, FLEETSHARD_TLS_PROXY="1").manage("check", "--deploy")
    assert "System check identified no issues" in proc.stdout + proc.stderr


def test_check_deploy_names_what_is_missing_without_the_proxy_settings(tmp_path):
    proc = role("master", tmp_path).manage("check", "--deploy", check=False)
    out = proc.stdout + proc.stderr
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in out


def test_check_deploy_refuses_the_development_secret_key(tmp_path):
    from common.settings.base import DEV_SECRET_KEY

    one = role("master", tmp_path, FLEETSHARD_TLS_PROXY="1", SECRET_KEY=DEV_SECRET_KEY)
    proc = one.manage("check", "--deploy", check=False)
    assert proc.returncode == 1 and "fleetshard.E001" in proc.stderr


def test_hsts_is_configurable(tmp_path):
    code = "from django.conf import settings as s; result = [s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS]"
    one = role("master", tmp_path, FLEETSHARD_TLS_PROXY="1", FLEETSHARD_HSTS_SECONDS="600")
    one.extra_env["FLEETSHARD_HSTS_INCLUDE_SUBDOMAINS"] = "0"
    assert one.shell(code) == [600, False]


def test_hosts_and_trusted_origins_come_from_the_environment(tmp_path):
    """Written as people write lists: spaces after commas, a trailing comma, an origin with a slash."""
    one = role(
        "master",
        tmp_path,
        ALLOWED_HOSTS="fleet.example.org, 127.0.0.1 ,",
        CSRF_TRUSTED_ORIGINS="https://fleet.example.org/, https://admin.example.org",
    )
    code = "from django.conf import settings as s; result = [s.ALLOWED_HOSTS, s.CSRF_TRUSTED_ORIGINS]"
    assert one.shell(code) == [
        ["fleet.example.org", "127.0.0.1"],
        ["https://fleet.example.org", "https://admin.example.org"],
    ]


@pytest.mark.parametrize("value", ["", " ", ",", " , "])
def test_an_allowed_hosts_set_to_nothing_is_refused_by_name(monkeypatch, value):
    from common.settings.base import env_list

    monkeypatch.setenv("ALLOWED_HOSTS", value)
    with pytest.raises(RuntimeError, match="ALLOWED_HOSTS is set but names nothing"):
        env_list("ALLOWED_HOSTS", "127.0.0.1", required=True)
    monkeypatch.delenv("ALLOWED_HOSTS")
    assert env_list("ALLOWED_HOSTS", "127.0.0.1,localhost", required=True) == ["127.0.0.1", "localhost"]


def test_behind_the_proxy_plain_http_is_redirected_but_probes_are_not(tmp_path):
    one = role("master", tmp_path, FLEETSHARD_TLS_PROXY="1", FLEETSHARD_HSTS_SECONDS="600")
    one.manage("migrate", "--noinput")
    port = free_port()
    proc = one.start("serve", "--bind", f"127.0.0.1:{port}", "--workers", "1", log_name="serve.log")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            return requests.get(base + "/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(up, timeout=60, what="the master")
        assert requests.get(base + "/readyz", timeout=5).status_code == 200
        plain = requests.get(base + "/admin/login/", timeout=5, allow_redirects=False)
        assert plain.status_code == 301 and plain.headers["Location"].startswith("https://")
        proxied = requests.get(base + "/admin/login/", headers={"X-Forwarded-Proto": "https"}, timeout=5)
        assert proxied.status_code == 200
        assert proxied.headers["Strict-Transport-Security"] == "max-age=600; includeSubDomains"
        assert "Secure" in proxied.headers["Set-Cookie"]
    finally:
        stop(proc)


def test_serve_takes_its_workers_from_web_concurrency_or_the_cores(monkeypatch):
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    assert default_workers() == 2 * (os.cpu_count() or 1) + 1
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    assert default_workers() == 3
    monkeypatch.setenv("FLEETSHARD_SERVE_THREADS", "8")
    assert default_threads() == 8
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv("WEB_CONCURRENCY", bad)
        with pytest.raises(CommandError, match=f"WEB_CONCURRENCY must be a whole number of at least 1, not '{bad}'"):
            default_workers()


def test_a_bad_hsts_value_is_refused_by_name(tmp_path):
    one = role("master", tmp_path, FLEETSHARD_TLS_PROXY="1", FLEETSHARD_HSTS_SECONDS="a year")
    proc = one.manage("check", check=False)
    assert proc.returncode == 1
    assert "FLEETSHARD_HSTS_SECONDS must be a whole number of seconds (0: no HSTS), not 'a year'" in proc.stderr

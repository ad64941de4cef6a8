"""Production settings: `check --deploy` is clean behind a TLS proxy, and `serve` sizes itself."""

import os
import secrets

import pytest
import requests
from django.core.management.base import CommandError

from server.management.commands.serve import default_threads, default_workers
from tests.support import Role, assert_status, free_port, stop, wait_until


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
    from server.settings.base import DEV_SECRET_KEY

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
    from server.settings.base import env_list

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
        assert_status(requests.get(base + "/readyz", timeout=5), 200)
        plain = requests.get(base + "/admin/login/", timeout=5, allow_redirects=False)
        assert_status(plain, 301)
        assert plain.headers["Location"].startswith("https://")
        proxied = requests.get(base + "/admin/login/", headers={"X-Forwarded-Proto": "https"}, timeout=5)
        assert_status(proxied, 200)
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


def test_a_bad_token_cache_size_is_refused_by_name(tmp_path):
    proc = role("master", tmp_path, FLEETSHARD_TOKEN_CACHE="-5").manage("check", check=False)
    assert proc.returncode == 1
    assert "FLEETSHARD_TOKEN_CACHE must be a whole number (0: no cache), not '-5'" in proc.stderr


@pytest.mark.parametrize(
    ("where", "name", "low"),
    [
        ("master", "FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS", "above 0"),
        ("master", "FLEETSHARD_RESULTS_UPLOAD_HORIZON_DAYS", "above 0"),
        ("shard", "FLEETSHARD_RESULTS_RETENTION_DAYS", "0 or more"),
        ("shard", "FLEETSHARD_RESULTS_UPLOAD_GRACE_DAYS", "0 or more"),
    ],
)
@pytest.mark.parametrize("value", ["1000000", "inf", "nan", "-7", "a week"])
def test_day_spans_that_are_no_date_are_refused_by_name(tmp_path, where, name, low, value):
    """1,000,000 days (an operator's "never") put `now - days` before year 1: on the master every
    heartbeat carrying a host event answered 500 and the shard resent it for ever; on a shard the
    results uploader failed every pass, so no result reached the master. inf and nan failed alike."""
    proc = role(where, tmp_path, **{name: value}).manage("check", check=False)
    assert proc.returncode == 1
    assert f"{name} must be a number of days {low} and at most 36500, not {value!r}" in proc.stderr


def test_a_host_event_age_of_zero_days_is_refused(tmp_path):
    proc = role("master", tmp_path, FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS="0").manage("check", check=False)
    assert "FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS must be a number of days above 0" in proc.stderr


def test_a_century_of_days_is_taken(tmp_path):
    proc = role("master", tmp_path, FLEETSHARD_HOST_EVENT_MAX_AGE_DAYS="36500").manage("check")
    assert proc.returncode == 0


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("FLEETSHARD_EXPORTS_PER_USER", "0", "must be a whole number of at least 1, not '0'"),
        ("FLEETSHARD_EXPORTS_PER_PROCESS", "0", "must be a whole number of at least 1, not '0'"),
        ("FLEETSHARD_EXPORTS_PER_USER", "-1", "must be a whole number of at least 1, not '-1'"),
        ("FLEETSHARD_EXPORT_DEADLINE_S", "inf", "must be a number of seconds above 0, not 'inf'"),
        ("FLEETSHARD_EXPORT_DEADLINE_S", "nan", "must be a number of seconds above 0, not 'nan'"),
        ("FLEETSHARD_EXPORT_DEADLINE_S", "0", "must be a number of seconds above 0, not '0'"),
        ("FLEETSHARD_EXPORT_DEADLINE_S", "5m", "must be a number of seconds above 0, not '5m'"),
    ],
)
def test_export_bounds_that_mean_nothing_are_refused_by_name(tmp_path, name, value, message):
    """A cap of 0 made every timeline export a 500 (min() of no slots); inf or nan, an export without end."""
    proc = role("master", tmp_path, **{name: value}).manage("check", check=False)
    assert proc.returncode == 1
    assert f"{name} {message}" in proc.stderr


@pytest.mark.parametrize(
    ("where", "name", "value", "message"),
    [
        ("shard", "FLEETSHARD_DISCOVERY_INTERVAL_S", "0", "must be a number from 1 to 86,400, not '0'"),
        ("shard", "FLEETSHARD_DISCOVERY_INTERVAL_S", "0.01", "must be a number from 1 to 86,400, not '0.01'"),
        ("shard", "FLEETSHARD_DISCOVERY_INTERVAL_S", "30s", "must be a number from 1 to 86,400, not '30s'"),
        ("shard", "FLEETSHARD_DISCOVERY_INTERVAL_S", "nan", "must be a number from 1 to 86,400, not 'nan'"),
        ("shard", "FLEETSHARD_MAX_DISCOVERED_HOSTS", "0", "must be a whole number from 1 to 1,000,000, not '0'"),
        ("master", "FLEETSHARD_MAX_DISCOVERED_HOSTS", "10k", "must be a whole number from 1 to 1,000,000, not '10k'"),
        ("master", "FLEETSHARD_MAX_DISCOVERED_HOSTS", "-5", "must be a whole number from 1 to 1,000,000, not '-5'"),
        ("master", "FLEETSHARD_DISCOVERED_FORGET_DAYS", "1000000", "must be a number of days above 0"),
    ],
)
def test_discovery_settings_that_mean_nothing_are_refused_by_name(tmp_path, where, name, value, message):
    """An interval of 0 ran the sources in a busy loop; `10k` hosts or a 30s interval failed with
    float()'s or int()'s error, naming no variable; 1,000,000 forget days put `now - days` before year 1."""
    proc = role(where, tmp_path, **{name: value}).manage("check", check=False)
    assert proc.returncode == 1
    assert f"{name} {message}" in proc.stderr

"""Settings: KCL defaults, env vars and TOML file with the right precedence, one ConfigError naming every bad value."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardherd.shared.config import CONFIG_FILE_ENV, Settings, default_worker_id, load_settings
from shardherd.shared.errors import ConfigError
from shardherd.shared.store import TableNames


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No SHARDHERD_* variable of the calling shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("SHARDHERD_"):
            monkeypatch.delenv(name)
    yield


def write_toml(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Write a config file and point SHARDHERD_CONFIG_FILE at it."""
    path = tmp_path / "shardherd.toml"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    return path


# KCL 3.5.1 defaults (`LeaseManagementConfig` and friends) that shardherd keeps, by shardherd setting name.
KCL_DEFAULTS: dict[str, object] = {
    "failover_time_millis": 10_000,
    "epsilon_millis": 25,
    "rebalance_threshold_percentage": 10,
    "dampening_percentage": 60,
    "variance_balancing_frequency": 3,
    "worker_metrics_ema_alpha": 0.5,
    "max_leases_for_worker": 2**31 - 1,
    "allow_throughput_overshoot": True,
    "graceful_lease_handoff_enabled": True,
    "graceful_lease_handoff_timeout_millis": 30_000,
    "consistent_reads": False,
    "billing_mode": "PAY_PER_REQUEST",
    "initial_lease_table_read_capacity": 10,
    "initial_lease_table_write_capacity": 10,
    "initial_position_in_stream": "TRIM_HORIZON",
    "disable_worker_metrics": False,
    "in_memory_worker_metrics_capture_frequency_millis": 1_000,
    "worker_metrics_reporter_freq_millis": 30_000,
    "no_of_persisted_metrics_per_worker_metrics": 10,
    "stale_worker_metrics_entry_cleanup_seconds": 86_400,
}


@pytest.mark.parametrize(("name", "kcl_value"), sorted(KCL_DEFAULTS.items()))
def test_defaults_are_kcl_defaults(name: str, kcl_value: object) -> None:
    assert getattr(load_settings(), name) == kcl_value


def test_unbounded_throughput_per_host_like_kcl() -> None:
    assert math.isinf(load_settings().max_throughput_per_host_kbps)


def test_renew_interval_is_kcl_formula_in_lease_mode_and_longer_for_worker_heartbeats() -> None:
    settings = load_settings()
    assert settings.liveness_mode == "worker"
    assert settings.effective_heartbeat_interval_millis == 10_000 * 2 // 5 - 25 == 3_975
    assert load_settings(liveness_mode="lease").effective_heartbeat_interval_millis == 10_000 // 3 - 25 == 3_308
    assert load_settings(failover_time_millis=30_000, liveness_mode="lease").effective_heartbeat_interval_millis \
        == 9_975
    assert load_settings(heartbeat_interval_millis=500).effective_heartbeat_interval_millis == 500


def test_worker_mode_reports_cpu_every_heartbeat_lease_mode_every_reporter_interval() -> None:
    assert load_settings().effective_metrics_report_millis == 3_975
    assert load_settings(liveness_mode="lease").effective_metrics_report_millis == 30_000
    assert load_settings(worker_metrics_reporter_freq_millis=2_000).effective_metrics_report_millis == 2_000
    # Never shorter than two CPU samples: an interval without one would report a failure (-1).
    assert load_settings(heartbeat_interval_millis=500).effective_metrics_report_millis == 2_000


def test_table_names_follow_kcl() -> None:
    assert load_settings(application_name="orders").table_names == TableNames(
        "orders", "orders-WorkerMetricStats", "orders-CoordinatorState")
    assert load_settings(application_name="orders", lease_table_name="legacy").table_names == TableNames(
        "legacy", "orders-WorkerMetricStats", "orders-CoordinatorState")


def test_default_worker_id_is_host_and_pid() -> None:
    assert default_worker_id().endswith(f":{os.getpid()}")
    assert load_settings().worker_id == default_worker_id()


def test_env_vars_are_read_and_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDHERD_FAILOVER_TIME_MILLIS", "20000")
    monkeypatch.setenv("SHARDHERD_GRACEFUL_LEASE_HANDOFF_ENABLED", "false")
    monkeypatch.setenv("SHARDHERD_WORKER_METRICS_EMA_ALPHA", "0.25")
    monkeypatch.setenv("SHARDHERD_STORE_BACKEND", "sql")
    monkeypatch.setenv("SHARDHERD_INITIAL_POSITION_IN_STREAM", "AT_TIMESTAMP")
    monkeypatch.setenv("SHARDHERD_INITIAL_TIMESTAMP", "2024-05-01T12:00:00+00:00")
    settings = load_settings()
    assert settings.failover_time_millis == 20_000
    assert settings.graceful_lease_handoff_enabled is False
    assert settings.worker_metrics_ema_alpha == 0.25
    assert settings.store_backend == "sql"
    assert settings.initial_timestamp is not None and settings.initial_timestamp.year == 2024


def test_toml_file_with_a_shardherd_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, '[shardherd]\napplication_name = "orders"\ndampening_percentage = 80\n', monkeypatch)
    settings = load_settings()
    assert (settings.application_name, settings.dampening_percentage) == ("orders", 80)


def test_toml_file_with_top_level_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, 'liveness_mode = "lease"\nepsilon_millis = 50\n', monkeypatch)
    settings = load_settings()
    assert (settings.liveness_mode, settings.epsilon_millis) == ("lease", 50)


def test_precedence_arguments_then_env_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, "[shardherd]\nepsilon_millis = 1\ndampening_percentage = 70\n"
               "rebalance_threshold_percentage = 20\n", monkeypatch)
    monkeypatch.setenv("SHARDHERD_EPSILON_MILLIS", "2")
    monkeypatch.setenv("SHARDHERD_DAMPENING_PERCENTAGE", "75")
    settings = load_settings(epsilon_millis=3)
    assert settings.epsilon_millis == 3  # argument beats env and file
    assert settings.dampening_percentage == 75  # env beats file
    assert settings.rebalance_threshold_percentage == 20  # file beats default
    assert settings.variance_balancing_frequency == 3  # default when nobody sets it


def test_settings_are_frozen() -> None:
    settings = load_settings()
    with pytest.raises(ValueError):
        settings.epsilon_millis = 1


def test_one_error_names_every_bad_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_toml(tmp_path, "[shardherd]\nvariance_balancing_frequency = 0\n", monkeypatch)
    monkeypatch.setenv("SHARDHERD_FAILOVER_TIME_MILLIS", "ten seconds")
    monkeypatch.setenv("SHARDHERD_LIVENESS_MODE", "heartbeat")
    with pytest.raises(ConfigError) as caught:
        load_settings(dampening_percentage=0, worker_metrics_ema_alpha=1.5, application_name="x")
    message = str(caught.value)
    # Each named as the user wrote it: the variable, the file's key, the argument.
    for name in ("SHARDHERD_FAILOVER_TIME_MILLIS:", "SHARDHERD_LIVENESS_MODE:",
                 "shardherd.toml key variance_balancing_frequency:", "dampening_percentage:",
                 "worker_metrics_ema_alpha:", "application_name:"):
        assert name in message, name
    assert "ten seconds" in message
    assert "epsilon_millis" not in message


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"initial_position_in_stream": "AT_TIMESTAMP"}, "initial_timestamp"),
        ({"heartbeat_interval_millis": 10_000}, "heartbeat_interval_millis"),
        ({"failover_time_millis": 100, "epsilon_millis": 0, "heartbeat_interval_millis": 200},
         "failover_time_millis"),
        ({"leader_lock_heartbeat_period_millis": 5_000, "leader_lock_lease_duration_millis": 8_000},
         "leader_lock_heartbeat_period_millis"),
        ({"stream_name": "a", "streams": [{"name": "b"}]}, "exclusive"),
        ({"streams": [{"name": "a"}, {"name": "a"}]}, "each stream once"),
        ({"streams": [{"name": "a", "initial_position": "AT_TIMESTAMP"}]}, "stream a: AT_TIMESTAMP"),
        ({"streams": [{"name": "a", "account_id": "acct"}]}, "account_id"),
        ({"streams": [{"name": "a", "shard": 1}]}, "shard"),
        ({"poison_policy": "quarantine"}, "poison_policy quarantine needs a poison_destination"),
        ({"poison_destination": "https://bucket.s3.amazonaws.com/x"}, "poison_destination"),
        ({"poison_destination": "file://relative/dir"}, "file:///absolute/directory"),
        ({"poison_destination": "s3:///prefix-without-bucket"}, "s3://bucket"),
    ],
)
def test_inconsistent_settings_are_rejected(overrides: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(**overrides)


def test_relation_errors_are_reported_together() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(initial_position_in_stream="AT_TIMESTAMP", heartbeat_interval_millis=20_000)
    assert "initial_timestamp" in str(caught.value)
    assert "heartbeat_interval_millis" in str(caught.value)


@pytest.mark.parametrize(("name", "value"), [
    ("application_name", "has space"),
    ("lease_table_name", "ab"),
    ("store_backend", "redis"),
    ("billing_mode", "ON_DEMAND"),
    ("rebalance_threshold_percentage", 101),
    ("epsilon_millis", -1),
    ("max_throughput_per_host_kbps", 0),
    ("lease_assignment_strategy", "random"),
    ("poison_policy", "skip"),
    ("poison_attempts", 0),
])
def test_out_of_range_values_name_the_setting(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        load_settings(**{name: value})


DURATIONS = [name for name in Settings.model_fields if name.endswith(("_millis", "_seconds"))]


@pytest.mark.parametrize("name", DURATIONS)
def test_every_duration_setting_has_an_upper_bound(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo such as 99999999999999999999 is refused with the setting's name, from env like from arguments."""
    monkeypatch.setenv(f"SHARDHERD_{name.upper()}", "99999999999999999999")
    with pytest.raises(ConfigError, match=f"SHARDHERD_{name.upper()}: Input should be less than or equal to"):
        load_settings()


def test_unknown_setting_in_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, "[shardherd]\nfailover_millis = 5000\n", monkeypatch)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "shardherd.toml key failover_millis: not a shardherd setting (did you mean failover_time_millis?)" \
        in str(caught.value)
    assert "Extra inputs" not in str(caught.value)


def test_a_misspelled_variable_is_an_error_with_the_closest_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDHERD_FAILOVER_TIME_MILIS", "3000")
    monkeypatch.setenv("SHARDHERD_NOTHING_LIKE_IT", "1")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "SHARDHERD_FAILOVER_TIME_MILIS: not a shardherd variable (did you mean SHARDHERD_FAILOVER_TIME_MILLIS?)" \
        in message
    assert "SHARDHERD_NOTHING_LIKE_IT: not a shardherd variable\n" in message + "\n"


def test_variables_other_modules_read_are_not_unknown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHARDHERD_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SHARDHERD_UP_RECORDS_DIR", str(tmp_path))
    monkeypatch.setenv("SHARDHERD_FAILOVER_TIME_MILLIS", "20000")
    assert load_settings().failover_time_millis == 20_000


def test_unknown_names_and_bad_values_come_in_one_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    write_toml(tmp_path, "[shardherd]\nliveness = 'lease'\nepsilon_millis = -1\n", monkeypatch)
    monkeypatch.setenv("SHARDHERD_REGON", "eu-west-1")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "SHARDHERD_REGON: not a shardherd variable (did you mean SHARDHERD_REGION?)" in message
    assert "key liveness: not a shardherd setting (did you mean liveness_mode?)" in message
    assert "shardherd.toml key epsilon_millis: Input should be greater than or equal to 0 (got -1)" in message


def test_missing_config_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_FILE_ENV, str(tmp_path / "absent.toml"))
    with pytest.raises(ConfigError, match=r"absent\.toml"):
        load_settings()


def test_invalid_toml_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_toml(tmp_path, "[shardherd\nepsilon_millis = ", monkeypatch)
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings()
    assert path.exists()


def test_shardherd_key_that_is_not_a_table_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, 'shardherd = "yes"\n', monkeypatch)
    with pytest.raises(ConfigError, match="must be a table"):
        load_settings()


def _failure_text(caught: pytest.ExceptionInfo[ConfigError]) -> str:
    """Everything a user could see of the error: its message, its chained causes and the printed traceback."""
    return caught.getrepr(chain=True, style="long").__str__() + str(caught.value)


def test_a_bad_secret_is_named_but_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "hunter2" + "-secret"  # built at run time, so the test's own source in a traceback does not hold it
    monkeypatch.setenv("SHARDHERD_API_TOKEN", secret)  # too short: 14 characters
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "SHARDHERD_API_TOKEN:" in str(caught.value) and "at least 16 characters" in str(caught.value)
    assert secret not in _failure_text(caught)
    assert caught.value.__cause__ is None and caught.value.__context__ is None  # no pydantic error with inputs


@pytest.mark.parametrize("name", ["dynamodb_endpoint_url", "kinesis_endpoint_url", "coordinator_url",
                                  "s3_endpoint_url"])
def test_urls_with_a_password_are_refused_without_echoing_it(name: str) -> None:
    password = "pa55" + "word-xyz"
    with pytest.raises(ConfigError) as caught:
        load_settings(**{name: f"http://admin:{password}@127.0.0.1:4566"})
    assert name in str(caught.value) and "password" in str(caught.value)
    assert password not in _failure_text(caught)


def test_a_relation_error_never_dumps_the_settings_with_their_secrets() -> None:
    token, password = "a-long-enough-" + "secret-token", "db-" + "pa55word"
    with pytest.raises(ConfigError) as caught:
        load_settings(initial_position_in_stream="AT_TIMESTAMP", api_token=token,
                      sql_url=f"postgresql+psycopg://app:{password}@127.0.0.1/leases")
    assert "initial_timestamp" in str(caught.value)
    assert token not in _failure_text(caught) and password not in _failure_text(caught)


def test_secrets_are_secret_str_and_never_printed() -> None:
    settings = load_settings(api_token="a-long-enough-secret-token",
                             sql_url="postgresql+psycopg://app:db-pa55word@127.0.0.1/leases")
    for shown in (repr(settings), str(settings), settings.model_dump_json()):
        assert "a-long-enough-secret-token" not in shown and "db-pa55word" not in shown
    assert settings.api_token is not None and settings.api_token.get_secret_value() == "a-long-enough-secret-token"
    assert settings.sql_url.get_secret_value().endswith("@127.0.0.1/leases")


def test_multi_stream_settings_from_toml_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(tmp_path, '[shardherd]\ninitial_position_in_stream = "LATEST"\n[[shardherd.streams]]\nname = "orders"\n'
               '[[shardherd.streams]]\nname = "clicks"\ncreation_epoch = 1700000000\n'
               'initial_position = "AT_TIMESTAMP"\ninitial_timestamp = 2026-01-01T00:00:00Z\n', monkeypatch)
    settings = load_settings()
    assert settings.multi_stream and settings.stream_names == ("orders", "clicks")
    assert settings.initial_position_for("orders") == ("LATEST", None)
    position, timestamp = settings.initial_position_for("clicks")
    assert position == "AT_TIMESTAMP" and timestamp is not None and timestamp.year == 2026
    assert settings.streams[1].creation_epoch == 1700000000 and settings.streams[0].account_id is None
    monkeypatch.setenv("SHARDHERD_STREAMS", '[{"name": "payments", "account_id": "123456789012"}]')
    from_env = load_settings()
    assert from_env.stream_names == ("payments",) and from_env.streams[0].account_id == "123456789012"


def test_single_stream_settings_stay_single_stream() -> None:
    settings = load_settings(stream_name="orders")
    assert not settings.multi_stream and settings.stream_names == ("orders",) and settings.streams == ()
    assert load_settings().stream_names == ()


def test_poison_settings_from_the_environment_and_a_misspelled_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDHERD_POISON_POLICY", "quarantine")
    monkeypatch.setenv("SHARDHERD_POISON_DESTINATION", "s3://dead-letters/orders")
    monkeypatch.setenv("SHARDHERD_POISON_ATTEMPTS", "5")
    settings = load_settings()
    assert (settings.poison_policy, settings.poison_destination, settings.poison_attempts) == (
        "quarantine", "s3://dead-letters/orders", 5)
    monkeypatch.setenv("SHARDHERD_POISON_POLICI", "block")
    with pytest.raises(ConfigError, match=r"did you mean SHARDHERD_POISON_POLICY\?"):
        load_settings()

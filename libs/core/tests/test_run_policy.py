"""flywheel.core.run_policy: which credential variables, callables and hosts a run may name."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from flywheel.core.run_policy import RunPolicySettings, env_names, policy_problems

SERVICE_SECRETS = [
    "FLYWHEEL_DB_URL",
    "FLYWHEEL_NATS_PASSWORD",
    "FLYWHEEL_S3_SECRET_KEY",
    "FLYWHEEL_OPTIMIZER_AUTH_TOKEN",
    "FLYWHEEL_EVALUATOR_JUDGE_AUTH_TOKEN",
    "FLYWHEEL_AUTH_TOKEN",
    "FLYWHEEL_RUN_POLICY_CALLABLE_MODULES",
    "flywheel_db_url",
    "DATABASE_URL",
    "PGPASSWORD",
    "AWS_SECRET_ACCESS_KEY",
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CREDENTIAL_ENV_PREFIX", "CREDENTIAL_ENVS", "CALLABLE_MODULES", "ALLOWED_HOSTS"):
        monkeypatch.delenv(f"FLYWHEEL_RUN_POLICY_{var}", raising=False)


@pytest.mark.parametrize("name", SERVICE_SECRETS)
def test_service_secrets_are_refused_even_when_listed(name: str) -> None:
    policy = RunPolicySettings(credential_envs=[name])
    problem = policy.env_problem(name)
    assert problem is not None and "may never name it" in problem


def test_only_the_prefix_or_the_list_may_be_named() -> None:
    policy = RunPolicySettings(credential_envs=["OPENAI_API_KEY"])
    assert policy.env_problem("FLYWHEEL_TARGET_OPENAI") is None
    assert policy.env_problem("OPENAI_API_KEY") is None
    assert "FLYWHEEL_RUN_POLICY_CREDENTIAL_ENVS" in (policy.env_problem("ANTHROPIC_API_KEY") or "")
    assert "only the prefix" in (policy.env_problem("FLYWHEEL_TARGET_") or "")
    assert "not an environment variable name" in (policy.env_problem("A B") or "")
    assert env_names("Bearer ${FLYWHEEL_TARGET_A} ${FLYWHEEL_DB_URL}") == ["FLYWHEEL_TARGET_A", "FLYWHEEL_DB_URL"]
    # A header template hiding a service secret behind an allowed one is refused for the secret.
    found = policy_problems(
        policy, env_vars=[("target.http.header_envs[Authorization]", "Bearer ${FLYWHEEL_TARGET_A}${FLYWHEEL_DB_URL}")]
    )
    assert found == [
        "target.http.header_envs[Authorization]: FLYWHEEL_DB_URL is one of the services' own settings or"
        " infrastructure secrets; a run may never name it"
    ]


@pytest.mark.parametrize("prefix", ["FLYWHEEL_", "FLYWHEEL_DB_", "FLYWHEEL_D", "FLYWHEEL_NATS_X", "AWS_"])
def test_a_prefix_reaching_service_settings_does_not_start(prefix: str) -> None:
    with pytest.raises(ValidationError, match="services' own settings"):
        RunPolicySettings(credential_env_prefix=prefix)


def test_lists_come_comma_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_RUN_POLICY_CALLABLE_MODULES", "mycompany.evals, flywheel.evaluator.examples")
    monkeypatch.setenv("FLYWHEEL_RUN_POLICY_ALLOWED_HOSTS", "api.example.com,127.0.0.1:8089")
    monkeypatch.setenv("FLYWHEEL_RUN_POLICY_CREDENTIAL_ENVS", "OPENAI_API_KEY")
    policy = RunPolicySettings()
    assert policy.callable_modules == ["mycompany.evals", "flywheel.evaluator.examples"]
    assert policy.allowed_hosts == ["api.example.com", "127.0.0.1:8089"]
    assert policy.credential_envs == ["OPENAI_API_KEY"]
    monkeypatch.setenv("FLYWHEEL_RUN_POLICY_CALLABLE_MODULES", "os")
    with pytest.raises(ValidationError, match="runs may never call it"):
        RunPolicySettings()


@pytest.mark.parametrize(
    "path",
    ["builtins:exec", "os:system", "subprocess:run", "importlib:import_module", "pickle:loads", "ctypes:CDLL"],
)
def test_dangerous_callables_are_refused_even_when_their_module_is_listed(path: str) -> None:
    # model_construct skips the settings check that refuses listing them, as a wrong deployment might.
    policy = RunPolicySettings.model_construct(callable_modules=[path.split(":")[0]], credential_env_prefix="")
    assert "may never be named by a run" in (policy.callable_problem(path) or "")


def test_callables_are_refused_by_default_and_by_module_boundary() -> None:
    assert "allowed: none" in (RunPolicySettings().callable_problem("json:loads") or "")
    policy = RunPolicySettings(callable_modules=["flywheel.evaluator.examples"])
    assert policy.callable_problem("flywheel.evaluator.examples:echo") is None
    assert policy.callable_problem("flywheel.evaluator.examples_evil:echo") is not None
    assert "private" in (policy.callable_problem("flywheel.evaluator.examples:echo.__globals__") or "")
    # Reaching os through an import of an allowed module: the name passes, what it resolves to does not.
    here = RunPolicySettings(callable_modules=[_metric.__module__])
    assert here.check_resolved(f"{_metric.__module__}:metric", _metric) is None
    assert "module posix" in (here.check_resolved(f"{_metric.__module__}:os.system", os.system) or "")
    assert "is a module" in (here.check_resolved(f"{_metric.__module__}:os", os) or "")


def _metric(output: str, expected: dict, input: dict) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://api.example.com/v1", True),
        ("HTTPS://API.Example.COM./v1", True),
        ("http://127.0.0.1:8089/v1", True),
        ("http://127.0.0.1:8090/v1", False),  # the entry names a port
        ("https://api.example.com:8443/v1", True),  # the entry names no port: any
        ("https://a.corp.example/x", True),
        ("https://corp.example/x", False),  # *.corp.example is its subdomains only
        ("http://api.example.com@evil.test/", False),  # userinfo: the host is evil.test
        ("http://evil.test/#@api.example.com", False),
        ("http://evil.test\\@api.example.com/", False),
        ("http://api.example.com.evil.test/", False),
        ("http://evil.test/?api.example.com", False),
        ("http://[::1]:8089/", False),
        ("ftp://api.example.com/", False),
        ("http://api.example.com:99999/", False),
        ("http://api.example.com /", False),
    ],
)
def test_host_allow_list(url: str, allowed: bool) -> None:
    policy = RunPolicySettings(allowed_hosts=["api.example.com", "127.0.0.1:8089", "*.corp.example"])
    assert (policy.url_problem(url) is None) is allowed, policy.url_problem(url)


def test_no_host_allow_list_allows_any_host_but_never_userinfo() -> None:
    policy = RunPolicySettings()
    assert policy.url_problem("https://anything.test/x") is None
    assert policy.url_problem("", llm=True) is None  # the provider's own host
    assert policy.url_problem("http://user:pw@anything.test/") is not None
    strict = RunPolicySettings(allowed_hosts=["api.example.com"])
    assert "must name its api_base" in (strict.url_problem("", llm=True) or "")

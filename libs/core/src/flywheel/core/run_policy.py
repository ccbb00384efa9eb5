"""What a run config (or an evaluation request on the bus) may name: the trust boundary
between whoever sends a run and the evaluator that carries it out.

A run names three kinds of things the evaluator then uses with its own privileges:

- **credential environment variables** (``api.auth.token_env``, an LLM target's
  ``api_key_env``, an HTTP target's ``header_envs``): the evaluator reads the variable and
  sends its value to the target. Only names under ``credential_env_prefix`` (default
  ``FLYWHEEL_TARGET_``) or listed in ``credential_envs`` may be named; the services' own
  settings (every other ``FLYWHEEL_*`` variable) and well-known infrastructure secrets
  (database, NATS, S3/AWS, cloud credentials) never may, even when listed.
- **Python callables** (a python target, a custom metric): the evaluator imports and calls
  them. Only modules under ``callable_modules`` may be named (empty, the default, refuses
  every callable); interpreter, process, file, network and serialisation modules are refused
  even when listed, and so is any private (``_``) name.
- **hosts** (an HTTP target's ``url``, an LLM target's ``api_base``): when ``allowed_hosts``
  is set, only those hosts; when it is empty (the default) any host, so a caller may send
  an allowed credential anywhere — set it in production.

Both the optimizer (StartRun) and the evaluator (each request, and again at call time) read
:class:`RunPolicySettings` (env prefix ``FLYWHEEL_RUN_POLICY_``) and call
:func:`policy_problems`, so the two never disagree. Lists in the environment are comma
separated: ``FLYWHEEL_RUN_POLICY_CALLABLE_MODULES=mycompany.evals,flywheel.evaluator.examples``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import ModuleType
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

ENV_PREFIX = "FLYWHEEL_RUN_POLICY_"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_ENV_REF = re.compile(r"\$\{([^}]*)\}")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_CALLABLE = re.compile(rf"(?P<module>{_IDENT}(?:\.{_IDENT})*):(?P<attr>{_IDENT}(?:\.{_IDENT})*)")

# Never a run's credential, whatever the lists say: the services' own settings and the
# secrets of the infrastructure they reach. (Names are compared upper-cased.)
RESERVED_ENV_PREFIXES = (
    "FLYWHEEL_NATS_",
    "FLYWHEEL_DB_",
    "FLYWHEEL_S3_",
    "FLYWHEEL_AUTH",
    "FLYWHEEL_RUN_POLICY_",
    "FLYWHEEL_OPTIMIZER_",
    "FLYWHEEL_EVALUATOR_",
    "FLYWHEEL_REWARD_JUDGE_",
    "FLYWHEEL_TRACE_STORE_",
    "FLYWHEEL_SOCIETY_",
    "FLYWHEEL_TRAINER_",
    "FLYWHEEL_MODELSERVER_",
    "FLYWHEEL_MODEL_SERVER_",
    "FLYWHEEL_SDK_",
    "FLYWHEEL_TLS_",
    "DATABASE_",
    "PG",
    "POSTGRES",
    "NATS_",
    "AWS_",
    "S3_",
    "MINIO_",
    "AZURE_",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GCP_",
    "KUBERNETES_",
    "SSH_",
)
# Modules whose functions run code, processes, files, sockets or deserialisation: refused
# as a callable's module (or a parent of it) even when an operator lists them.
DENIED_MODULES = frozenset(
    {
        "builtins",
        "os",
        "posix",
        "nt",
        "sys",
        "subprocess",
        "importlib",
        "shutil",
        "socket",
        "ssl",
        "select",
        "selectors",
        "pickle",
        "marshal",
        "shelve",
        "dill",
        "cloudpickle",
        "joblib",
        "ctypes",
        "cffi",
        "multiprocessing",
        "concurrent",
        "threading",
        "asyncio",
        "signal",
        "pty",
        "tty",
        "fcntl",
        "resource",
        "code",
        "codeop",
        "runpy",
        "pdb",
        "bdb",
        "inspect",
        "types",
        "gc",
        "operator",
        "functools",
        "io",
        "pathlib",
        "tempfile",
        "glob",
        "fileinput",
        "zipfile",
        "tarfile",
        "zipimport",
        "pkgutil",
        "platform",
        "webbrowser",
        "http",
        "urllib",
        "urllib3",
        "requests",
        "httpx",
        "aiohttp",
        "ftplib",
        "smtplib",
        "telnetlib",
        "xmlrpc",
        "yaml",
        "jinja2",
        "flywheel.core",
        "flywheel.stack",
    }
)


def _comma_list(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _module_matches(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


class RunPolicySettings(BaseSettings):
    """What runs may name (env prefix ``FLYWHEEL_RUN_POLICY_``); refuses by default."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    # Credential env vars a run may name: every name under this prefix ("" for none)...
    credential_env_prefix: str = "FLYWHEEL_TARGET_"
    # ...and these exact names (e.g. OPENAI_API_KEY); reserved names stay refused.
    credential_envs: Annotated[list[str], NoDecode] = []
    # Modules (with their submodules) whose functions a run may name as a python target
    # or custom metric; empty refuses every callable.
    callable_modules: Annotated[list[str], NoDecode] = []
    # Hosts HTTP and LLM targets may reach: "host", "host:port", "*.domain" or "[v6]:port";
    # empty allows any host.
    allowed_hosts: Annotated[list[str], NoDecode] = []

    @field_validator("credential_envs", "callable_modules", "allowed_hosts", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return _comma_list(value)

    @field_validator("credential_env_prefix")
    @classmethod
    def _prefix_is_not_reserved(cls, value: str) -> str:
        upper = value.upper()
        if value and (
            not _ENV_NAME.fullmatch(value)
            or upper in ("FLYWHEEL", "FLYWHEEL_")
            or any(r.startswith(upper) or upper.startswith(r) for r in RESERVED_ENV_PREFIXES)
        ):
            raise ValueError(
                f"{value!r} would let runs name the services' own settings or infrastructure secrets;"
                " use a prefix of its own such as FLYWHEEL_TARGET_"
            )
        return value

    @field_validator("callable_modules")
    @classmethod
    def _modules_are_dotted_names(cls, value: list[str]) -> list[str]:
        for module in value:
            if not re.fullmatch(rf"{_IDENT}(\.{_IDENT})*", module):
                raise ValueError(f"{module!r} is not a dotted module name")
            if _module_matches(module, DENIED_MODULES):
                raise ValueError(f"{module} runs code, processes, files or sockets; runs may never call it")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_parse(cls, value: list[str]) -> list[str]:
        for entry in value:
            _host_entry(entry)
        return value

    # -- single checks: None when allowed, else what is wrong -------------------------------
    def env_problem(self, name: str) -> str | None:
        """Why a run may not name ``name`` as a credential variable (None: it may)."""
        if not _ENV_NAME.fullmatch(name):
            return f"{name!r} is not an environment variable name"
        upper = name.upper()
        prefix = self.credential_env_prefix.upper()
        under_prefix = bool(prefix) and upper.startswith(prefix) and len(upper) > len(prefix)
        if prefix and upper == prefix:
            return f"{name} is only the prefix; name a variable under it, such as {prefix}API_KEY"
        if any(upper.startswith(r) for r in RESERVED_ENV_PREFIXES) or (
            upper.startswith("FLYWHEEL_") and not under_prefix
        ):
            return f"{name} is one of the services' own settings or infrastructure secrets; a run may never name it"
        if under_prefix or name in self.credential_envs:
            return None
        allowed = f"names starting {self.credential_env_prefix}" if prefix else "no prefix"
        listed = f" or one of {', '.join(self.credential_envs)}" if self.credential_envs else ""
        return (
            f"{name} is not a credential variable runs may name ({allowed}{listed};"
            f" see {ENV_PREFIX}CREDENTIAL_ENV_PREFIX and {ENV_PREFIX}CREDENTIAL_ENVS)"
        )

    def callable_problem(self, path: str) -> str | None:
        """Why a run may not name ``package.module:function`` (None: it may). Checks the
        text only; :func:`check_resolved` checks what importing it actually gave."""
        found = _CALLABLE.fullmatch(path)
        if not found:
            return f"{path!r} must look like 'package.module:function'"
        module, attr = found["module"], found["attr"]
        if any(part.startswith("_") for part in (*module.split("."), *attr.split("."))):
            return f"{path!r} names a private (_) module or attribute"
        if _module_matches(module, DENIED_MODULES):
            return f"{path!r}: module {module} may never be named by a run"
        if not _module_matches(module, self.callable_modules):
            listed = ", ".join(self.callable_modules) or "none"
            return (
                f"{path!r}: module {module} is not one runs may call (allowed: {listed};"
                f" see {ENV_PREFIX}CALLABLE_MODULES)"
            )
        return None

    def check_resolved(self, path: str, found: object) -> str | None:
        """Why the object ``path`` resolved to may not be called: it must be defined in an
        allowed module (``mymodule:os.system`` reaches ``os`` through an import)."""
        if isinstance(found, ModuleType):
            return f"{path!r} is a module, not a function"
        defined_in = getattr(found, "__module__", None)
        if not isinstance(defined_in, str) or not defined_in:
            return f"{path!r} resolves to an object with no defining module"
        if _module_matches(defined_in, DENIED_MODULES) or not _module_matches(defined_in, self.callable_modules):
            return f"{path!r} resolves to a function of module {defined_in}, which runs may not call"
        return None

    def url_problem(self, url: str, *, llm: bool = False) -> str | None:
        """Why a target may not reach ``url`` (None: it may). An LLM target with no
        ``api_base`` goes to its provider's own host, which is allowed only when no host
        allow-list is set."""
        if not url:
            if llm and self.allowed_hosts:
                return "is empty, and with a host allow-list an LLM target must name its api_base"
            return None
        if any(ch.isspace() or ord(ch) < 32 or ch == "\\" for ch in url):
            return f"{url!r} holds whitespace, control characters or a backslash"
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            return f"{url!r} is not a valid URL ({exc})"
        if parts.scheme.lower() not in ("http", "https"):
            return f"{url!r} must start with http:// or https://"
        if "@" in parts.netloc:  # not echoed: it may hold a password
            return "the URL holds user info (user:password@) before the host; name a credential variable instead"
        host = _normal_host(parts.hostname or "")
        if not host:
            return f"{url!r} has no host"
        if not self.allowed_hosts:
            return None
        port = port or (443 if parts.scheme.lower() == "https" else 80)
        for entry in self.allowed_hosts:
            want_host, want_port = _host_entry(entry)
            host_ok = host == want_host or (want_host.startswith("*.") and host.endswith(want_host[1:]))
            if host_ok and want_port in (None, port):
                return None
        return (
            f"host {host}:{port} is not one targets may reach (allowed: {', '.join(self.allowed_hosts)};"
            f" see {ENV_PREFIX}ALLOWED_HOSTS)"
        )


def _normal_host(host: str) -> str:
    return host.lower().rstrip(".")


def _host_entry(entry: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``*.domain`` or ``[v6]:port`` -> (lower-case host, port)."""
    try:
        parts = urlsplit("//" + entry.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"allowed host {entry!r} is not host or host:port ({exc})") from None
    host = _normal_host(parts.hostname or "")
    if entry.strip().startswith("*."):
        host = "*." + _normal_host(entry.strip()[2:].split(":")[0])
    if not host or "@" in parts.netloc or parts.path:
        raise ValueError(f"allowed host {entry!r} is not host or host:port")
    return host, port


def env_names(ref: str) -> list[str]:
    """The variables an env reference names: ``VAR`` or every ``${VAR}`` in ``Bearer ${VAR}``."""
    return _ENV_REF.findall(ref) if "${" in ref else [ref]


def policy_problems(
    policy: RunPolicySettings,
    *,
    env_vars: Iterable[tuple[str, str]] = (),
    callables: Iterable[tuple[str, str]] = (),
    urls: Iterable[tuple[str, str]] = (),
    llm_api_bases: Iterable[tuple[str, str]] = (),
) -> list[str]:
    """Every ``field.path: problem`` for what a run names, each given as (field path, value):
    credential variable names (or ``${VAR}`` templates), ``module:function`` callables, target
    URLs, and LLM ``api_base`` values (which may be empty). Empty when all is allowed."""
    found: list[str] = []
    for field, ref in env_vars:
        for name in env_names(ref) or [ref]:
            problem = policy.env_problem(name)
            if problem:
                found.append(f"{field}: {problem}")
    for field, path in callables:
        problem = policy.callable_problem(path)
        if problem:
            found.append(f"{field}: {problem}")
    for field, url in urls:
        problem = policy.url_problem(url)
        if problem:
            found.append(f"{field}: {problem}")
    for field, url in llm_api_bases:
        problem = policy.url_problem(url, llm=True)
        if problem:
            found.append(f"{field}: {problem}")
    return found

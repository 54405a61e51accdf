"""The database URL from AWS Secrets Manager, for the Lambda (never plain text in its config).

The secret holds a URL, JSON with a ``url`` key, or the JSON RDS writes for a managed
secret (``username``, ``password``, ``host``, ``port``, ``dbname``, and ``engine``:
``mysql``/``mariadb``/``aurora-mysql``, or ``postgres``/``aurora-postgresql``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from batchrun.errors import ConfigError

CACHE_S = 300.0  # picks up a rotated secret within five minutes

# Only the URL string is cached across invocations, never a client: a client is bound to
# the event loop of the invocation that made it (see batchrun.aws_lambda).
_cache: dict[str, tuple[float, str]] = {}


def url_from_secret(text: str) -> str:
    """The database URL a secret's value stands for."""
    text = text.strip()
    if not text.startswith("{"):
        if "://" not in text:
            raise ConfigError("the database secret is neither a URL nor JSON")
        return text
    try:
        data: Any = json.loads(text)
    except ValueError:
        raise ConfigError("the database secret is neither a URL nor JSON") from None
    if not isinstance(data, dict):
        raise ConfigError("the database secret's JSON is not an object")
    if isinstance(data.get("url"), str):
        return str(data["url"])
    engine = str(data.get("engine") or "mysql").lower()
    scheme = _SCHEMES.get(engine)
    if scheme is None:
        raise ConfigError(
            f"the database secret's engine {engine[:40]!r} is not one batchrun connects to "
            f"(known: {', '.join(sorted(_SCHEMES))})"
        )
    try:
        user = quote(str(data["username"]), safe="")
        password = quote(str(data["password"]), safe="")
        host = str(data["host"])
        port = int(data.get("port", _PORTS[scheme]))
        name = quote(str(data["dbname"]), safe="")
    except (KeyError, TypeError, ValueError):
        raise ConfigError(
            "the database secret's JSON needs 'url', or username, password, host and dbname"
        ) from None
    return f"{scheme}://{user}:{password}@{host}:{port}/{name}"


# RDS's "engine" in a managed secret -> the URL scheme; without one, MySQL (as before).
_SCHEMES = {
    "mysql": "mysql",
    "mariadb": "mysql",
    "aurora": "mysql",
    "aurora-mysql": "mysql",
    "postgres": "postgresql",
    "postgresql": "postgresql",
    "aurora-postgresql": "postgresql",
}
_PORTS = {"mysql": 3306, "postgresql": 5432}


async def database_url(arn: str, env: Mapping[str, str]) -> str:
    """Fetch (or reuse, for CACHE_S) the database URL stored in secret ``arn``."""
    cached = _cache.get(arn)
    if cached is not None and time.monotonic() - cached[0] < CACHE_S:
        return cached[1]
    import aioboto3  # lazy: only a deployment with a secret pays for it
    from aiobotocore.config import AioConfig

    parts = arn.split(":")
    region = parts[3] if len(parts) > 3 and parts[3] else env.get("AWS_REGION")
    endpoint = env.get("AWS_ENDPOINT_URL_SECRETS_MANAGER") or env.get("AWS_ENDPOINT_URL")
    session = aioboto3.Session(
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=env.get("AWS_SESSION_TOKEN"),
        region_name=region or env.get("AWS_DEFAULT_REGION"),
    )
    config = AioConfig(connect_timeout=3, read_timeout=5, retries={"max_attempts": 2})
    try:
        async with session.client("secretsmanager", endpoint_url=endpoint, config=config) as client:
            reply = await client.get_secret_value(SecretId=arn)
    except Exception as exc:  # botocore, aiohttp and timeouts alike; the value never shows
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
        raise ConfigError(f"cannot read the database secret {arn}: {code}") from None
    url = url_from_secret(str(reply.get("SecretString", "")))
    _cache[arn] = (time.monotonic(), url)
    return url


def forget(arn: str) -> None:
    """Drop the cached URL (e.g. after the database refused the credentials)."""
    _cache.pop(arn, None)

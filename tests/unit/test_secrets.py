"""mask_secrets: passwords and keys never survive into text shown to humans."""

from __future__ import annotations

import pytest

from bridge.secrets import MASK, mask_secrets


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "Driver={PostgreSQL Unicode};Server=db;Uid=bridge;PWD=hunter2;Database=x",
            "Driver={PostgreSQL Unicode};Server=db;Uid=bridge;PWD=***;Database=x",
            id="odbc-pwd",
        ),
        pytest.param("Uid=sa;Password=hunter2", "Uid=sa;Password=***", id="odbc-password-last"),
        pytest.param("uid=sa;pwd=hunter2;", "uid=sa;pwd=***;", id="lower-case-key"),
        pytest.param("Uid=sa;PassWord=hunter2", "Uid=sa;PassWord=***", id="mixed-case-key"),
        pytest.param("Uid=sa; Pwd = hunter2 ;x=1", "Uid=sa; Pwd = ***;x=1", id="spaces-around"),
        pytest.param(
            "Uid=sa;PWD={hun;ter=2};Server=db",
            "Uid=sa;PWD=***;Server=db",
            id="braced-with-semicolons",
        ),
        pytest.param(
            "Uid=sa;PWD={a}}b;c};Server=db",
            "Uid=sa;PWD=***;Server=db",
            id="braced-with-escaped-brace",
        ),
        pytest.param("Uid=sa;PWD={unterminated;x=1", "Uid=sa;PWD=***", id="unterminated-brace"),
        pytest.param("PWD=pass word&more;x=1", "PWD=***;x=1", id="odbc-value-with-space-and-amp"),
        pytest.param("Uid=sa;PWD=;x=1", "Uid=sa;PWD=***;x=1", id="empty-value"),
        pytest.param("SSLPassword=hunter2;x=1", "SSLPassword=***;x=1", id="prefixed-key"),
        pytest.param(
            "host=db password='hun ter2' dbname=x",
            "host=db password=*** dbname=x",
            id="libpq-quoted",
        ),
        pytest.param(
            "postgresql://bridge:hunter2@db:5432/sender",
            "postgresql://bridge:***@db:5432/sender",
            id="url-userinfo",
        ),
        pytest.param(
            "postgresql://bridge:hun@ter/2@db/sender",
            "postgresql://bridge:***@db/sender",
            id="url-password-with-at-and-slash",
        ),
        pytest.param(
            "postgresql://db/sender?user=bridge&password=hunter2&sslmode=require",
            "postgresql://db/sender?user=bridge&password=***&sslmode=require",
            id="url-query-password",
        ),
        pytest.param(
            "https://0123456789abcdef0123456789abcdef:fedcba9876543210fedcba9876543210"
            "@o1.ingest.sentry.io/42",
            "https://***:***@o1.ingest.sentry.io/42",
            id="legacy-sentry-dsn",
        ),
        pytest.param(
            "https://0123456789abcdef0123456789abcdef@o1.ingest.sentry.io/42",
            "https://***@o1.ingest.sentry.io/42",
            id="sentry-dsn-key",
        ),
        pytest.param(
            "connect to 'postgresql://u:p4ss@h/db' failed",
            "connect to 'postgresql://u:***@h/db' failed",
            id="url-inside-message",
        ),
        pytest.param("api_key=abc123;x=1", "api_key=***;x=1", id="api-key"),
    ],
)
def test_mask_secrets_hides_the_secret_and_keeps_the_rest(text: str, expected: str) -> None:
    assert mask_secrets(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Driver={PostgreSQL Unicode};Server=db;Uid=bridge;Database=x", id="no-pwd"),
        pytest.param("postgresql://bridge@db:5432/sender", id="url-with-user-only"),
        pytest.param("https://example.com/path?q=1", id="plain-url"),
        pytest.param("Uid=pwdadmin;Server=db", id="pwd-inside-another-value"),
        pytest.param("routes[2].database: no database named 'recever'", id="ordinary-message"),
        pytest.param("", id="empty"),
    ],
)
def test_mask_secrets_leaves_text_without_secrets_alone(text: str) -> None:
    assert mask_secrets(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "Uid=sa;PWD={a;b}}c};Server=db",
        "postgresql://u:p@h/db?password=x&y=1",
        "https://0123456789abcdef0123456789abcdef:s3cr3t@sentry.example/1",
        "PWD=x\nPassword=y",
    ],
)
def test_mask_secrets_is_idempotent(text: str) -> None:
    once = mask_secrets(text)
    assert mask_secrets(once) == once


def test_mask_secrets_masks_every_occurrence_on_every_line() -> None:
    text = "a: PWD=one;x=1\nb: Password=two\nc: postgresql://u:three@h/db"
    masked = mask_secrets(text)
    for secret in ("one", "two", "three"):
        assert secret not in masked
    assert masked.count(MASK) == 3


def test_a_dotnet_public_key_token_is_not_a_secret() -> None:
    type_name = "Shared.Order, Shared, Version=1.0.0.0, Culture=neutral, PublicKeyToken=b77a5c5619"
    assert mask_secrets(type_name) == type_name
    assert mask_secrets("AccessToken=abc") == "AccessToken=***"

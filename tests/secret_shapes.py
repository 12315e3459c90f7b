"""Every secret shape of the issue 16 audit, shared by the redaction tests."""

from __future__ import annotations

import json
from collections.abc import Callable


def _pem(s: str) -> str:
    return f"-----BEGIN RSA PRIVATE KEY-----\nMIIE{s}\n{s}==\n-----END RSA PRIVATE KEY-----"


#: Every shape of the issue 16 audit, and a few more: (name, text holding the secret).
SHAPES: dict[str, Callable[[str], str]] = {
    "bearer header": lambda s: f"401: Authorization: Bearer {s}",
    "query access_token": lambda s: f"GET https://api.example/me?access_token={s}&page=2",
    "camelCase accessToken json": lambda s: json.dumps({"accessToken": s, "n": 1}),
    "camelCase refreshToken kv": lambda s: f"refresh failed refreshToken={s} retry",
    "camelCase clientSecret json": lambda s: f'body {{"clientSecret": "{s}"}}',
    "X-Token-Value header": lambda s: f"headers: X-Token-Value: {s}\nAccept: */*",
    "X-Api-Key header": lambda s: f"X-Api-Key: {s}",
    "Cookie header": lambda s: f"Cookie: theme=dark; session={s}; lang=en",
    "Set-Cookie header": lambda s: f"Set-Cookie: sid={s}; Path=/; HttpOnly",
    "json inside json": lambda s: json.dumps({"error": json.dumps({"password": s})}),
    "json in json in json": lambda s: json.dumps(
        {"e": json.dumps({"d": json.dumps({"api_key": s})})}
    ),
    "?key=": lambda s: f"https://maps.example/geo?key={s}",
    "sig=": lambda s: f"https://blob.example/c/f?sv=2020&sig={s}&se=2030",
    "code=": lambda s: f"GET /oauth/callback?code={s}&state=xyz",
    "aws_secret_access_key=": lambda s: f"aws_secret_access_key={s}",
    "pwd=": lambda s: f"Server=db;Uid=app;pwd={s};",
    "PEM block": _pem,
    "bare ghp_": lambda s: f"rejected ghp_{s} for repo",
    "bare sk_live_": lambda s: f"stripe said no to sk_live_{s}.",
    "telegram /bot path": lambda s: f"POST https://api.telegram.org/bot123456:{s}/sendMessage",
    "slack webhook path": lambda s: f"https://hooks.slack.com/services/T0001/B0002/{s}",
    "discord webhook path": lambda s: f"https://discord.com/api/webhooks/12345/{s}",
    "url password": lambda s: f"postgresql://app:{s}@db.internal/main",
    "yaml api_key": lambda s: f"config:\n  api_key: {s}\n  region: eu",
    "python repr": lambda s: repr({"client_secret": s, "n": 1}),
    "password with spaces json": lambda s: json.dumps({"password": f"correct horse {s} staple"}),
    "password with spaces header": lambda s: f"Password: correct horse {s} staple",
    "password with spaces kv": lambda s: f"password=correct horse {s} staple",
    "jwt": lambda s: f"token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOi{s}.{s}",
}

"""Broker and store URLs: redacted for every log line, and TLS that verifies by default.

``redact(text)`` (``scorers.scrub_secrets``) hides every password a URL in ``text`` carries
(``scheme://user:pass@``, ``scheme://:pass@``, ``?password=...``), in any number of URLs (sentinel
lists, error messages that quote the URL), and any token or key it quotes. Every place that
prints a broker or store URL goes through it.

``BrokerTLS`` holds the two TLS settings (``TRACESCORE_BROKER_CA_FILE``,
``TRACESCORE_BROKER_TLS_INSECURE``) and renders them for each client library: kombu/Celery
(``ssl=`` / ``broker_use_ssl``), redis-py keyword arguments, and redis-py URL query
parameters (for code that only takes a URL). A ``rediss://`` URL always verifies the server's
certificate (against the CA file, else the system's CAs) unless insecure is asked for by name:
kombu alone would silently turn verification off for ``rediss://``.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from scorers import scrub_secrets

__all__ = ["CA_FILE_ENV", "INSECURE_ENV", "BrokerTLS", "redact"]

CA_FILE_ENV = "TRACESCORE_BROKER_CA_FILE"
INSECURE_ENV = "TRACESCORE_BROKER_TLS_INSECURE"
# The name tracing and worker call it by: the one scrubber, which knows URL passwords as well as
# tokens and key shapes (a broker error can quote either).
redact = scrub_secrets
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def _is_tls(url: str) -> bool:
    return url.lower().startswith("rediss://")


@dataclass(frozen=True, slots=True)
class BrokerTLS:
    """How ``rediss://`` connections check the server: ``ca_file`` (PEM) or the system CAs;
    ``insecure=True`` skips the check (only for tests and known self-signed set-ups)."""

    ca_file: str | None = None
    insecure: bool = False

    @classmethod
    def from_env(cls) -> BrokerTLS:
        """From ``TRACESCORE_BROKER_CA_FILE`` / ``TRACESCORE_BROKER_TLS_INSECURE``."""
        raw = os.environ.get(INSECURE_ENV, "").strip().lower()
        if raw not in _TRUE | _FALSE:
            raise ValueError(f"{INSECURE_ENV} must be true or false, got {raw!r}")
        return cls(ca_file=os.environ.get(CA_FILE_ENV) or None, insecure=raw in _TRUE)

    def kombu_ssl(self, url: str) -> dict[str, Any] | None:
        """kombu ``Connection(ssl=...)`` / Celery ``broker_use_ssl``; None for plain ``redis://``."""
        if not _is_tls(url):
            return None
        options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_NONE if self.insecure else ssl.CERT_REQUIRED}
        if self.ca_file and not self.insecure:
            options["ssl_ca_certs"] = self.ca_file
        return options

    def redis_kwargs(self, url: str) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis.from_url(url, **...)``; empty for ``redis://``."""
        if not _is_tls(url):
            return {}
        if self.insecure:
            return {"ssl_cert_reqs": "none", "ssl_check_hostname": False}
        kwargs: dict[str, Any] = {"ssl_cert_reqs": "required"}
        if self.ca_file:
            kwargs["ssl_ca_certs"] = self.ca_file
        return kwargs

    def url(self, url: str) -> str:
        """``url`` with the TLS options as query parameters, for code that takes only a URL
        (redis-py's ``from_url`` reads them); parameters already in the URL win."""
        extra = {k: str(v) for k, v in self.redis_kwargs(url).items()}
        if not extra:
            return url
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        present = {k for k, _ in query}
        query += [(k, v) for k, v in extra.items() if k not in present]
        return urlunsplit(parts._replace(query=urlencode(query)))

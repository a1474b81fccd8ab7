"""Every default of ``edge-rag serve`` in one frozen, validated config."""
from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

TOKEN_ENV = "EDGE_RAG_TOKEN"
LOOPBACK = "127.0.0.1"
# An operator's token shorter than this is refused off loopback, warned of on it: the throttle (auth.Tries) reads a
# wrong token a minute per address, but each address on a network has its own: 2 letters (3,844) fall in hours to a few.
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class ServeConfig:
    """Where to listen, who may write, and the limits that keep one small device answering."""

    host: str = LOOPBACK  # another interface needs a token (writes change what the kiosk answers)
    port: int = 8080  # 0 = any free port (printed at start)
    token: str | None = None  # writes (upload, remove) need it; none: read-only; mandatory off loopback
    allowed_hosts: tuple[str, ...] = ()  # Host names besides the served address that state-changing requests may use
    max_question_chars: int = 500  # a kiosk question; the pipeline's own hard limit is higher
    max_body_bytes: int = 16 * 1024  # JSON bodies of /api/ask
    max_upload_bytes: int = 20 * 2**20  # one upload request, all files together
    max_upload_files: int = 20  # files in one upload request
    question_timeout_s: float = 60.0  # from arrival to answer, waiting for the generator included
    max_queue: int = 8  # GPT-route questions waiting behind the running generation; more get 503
    idle_reset_s: int = 90  # the page clears itself after this long without a touch
    suggestions: int = 6  # suggested questions on the page
    title: str = "Ask me anything about this place"  # heading of the kiosk page
    keepalive_s: float = 15.0  # an SSE comment this often while a stream waits (queue, prompt evaluation)
    shutdown_grace_s: float = 10.0  # on SIGTERM/Ctrl-C: how long open streams may take to finish
    header_timeout_s: float = 10.0  # a request's headers must arrive within this (slow-header clients are cut off)
    question_log: str | None = None  # append accepted questions here, for `edge-rag calibrate` (question_log.py)
    min_labels: int = 100  # labelled questions the /admin page's calibration needs, at least

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, not {self.port}")
        if not is_loopback(self.host) and not self.token:
            raise ValueError(f"listening on {self.host} (not loopback) needs an API token: pass --token, "
                             f"--token-file or set {TOKEN_ENV}")
        if self.token and short(self.token) and not is_loopback(self.host):
            raise ValueError(f"listening on {self.host} (not loopback) needs an API token of at least "
                             f"{MIN_TOKEN_CHARS} characters: a shorter one is guessed by the devices on the network; "
                             "choose a longer one, or name a new --token-file FILE, which the first start fills with a "
                             "random one")
        for name in ("max_question_chars", "max_body_bytes", "max_upload_bytes", "max_upload_files",
                     "question_timeout_s", "idle_reset_s", "keepalive_s", "header_timeout_s", "min_labels"):
            if not 0 < getattr(self, name) < math.inf:  # NaN compares false: --timeout nan timed nothing out
                raise ValueError(f"{name} must be positive and finite, not {getattr(self, name)}")
        for name in ("max_queue", "suggestions"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")


def short(token: str) -> bool:
    """Too short a token for anyone but this machine's own programs to be kept out by it (never printed)."""
    return len(token) < MIN_TOKEN_CHARS


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

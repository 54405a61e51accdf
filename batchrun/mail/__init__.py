"""Mail backends behind one Mailer protocol, chosen by URL scheme (imported lazily)."""

from __future__ import annotations

from batchrun.mail.base import Mailer, Message, from_url, valid_address

__all__ = ["Mailer", "Message", "from_url", "valid_address"]

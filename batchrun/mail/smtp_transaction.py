"""One SMTP mail transaction (MAIL, RCPT, DATA) for a message batchrun built, on an open
aiosmtplib connection."""

from __future__ import annotations

import contextlib

import aiosmtplib


async def transaction(client: aiosmtplib.SMTP, sender: str, rcpt: str, raw: bytes) -> None:
    """MAIL, RCPT and DATA for one message built by ``Message.to_bytes``.

    ``client.sendmail`` would parse both addresses twice and pass the message through two
    line-ending regexes and a dot-stuffing regex: ~230 µs of CPU for a 3.7 KB message,
    measured, as much as the rest of batchrun's work per user. Here the addresses were
    validated when the message was built, ``to_bytes`` writes CRLF lines already, and
    dot-stuffing is one ``bytes.replace``. Errors are aiosmtplib's own exceptions, raised
    as ``sendmail`` raises them (after RSET, so the connection stays usable). A non-ASCII
    address (SMTPUTF8) goes through ``sendmail``, which negotiates it.
    """
    if not (sender.isascii() and rcpt.isascii()):
        options = ["SMTPUTF8"] if client.supports_extension("smtputf8") else []
        await client.sendmail(sender, [rcpt], raw, mail_options=options, timeout=None)
        return
    mail_from = [b"FROM:<" + sender.encode("ascii") + b">"]
    if client.supports_extension("size"):
        mail_from.append(b"SIZE=%d" % len(raw))
    try:
        reply = await client.execute_command(b"MAIL", *mail_from, timeout=None)
        if reply.code != 250:
            raise aiosmtplib.SMTPSenderRefused(reply.code, reply.message, sender)
        reply = await client.execute_command(
            b"RCPT", b"TO:<" + rcpt.encode("ascii") + b">", timeout=None
        )
        if reply.code not in (250, 251):
            raise aiosmtplib.SMTPRecipientsRefused(
                [aiosmtplib.SMTPRecipientRefused(reply.code, reply.message, rcpt)]
            )
        reply = await client.execute_command(b"DATA", timeout=None)
        if reply.code != 354:
            raise aiosmtplib.SMTPDataError(reply.code, reply.message)
    except (aiosmtplib.SMTPResponseException, aiosmtplib.SMTPRecipientsRefused):
        if client.is_connected:  # a broken one is closed by the caller
            with contextlib.suppress(aiosmtplib.SMTPException, OSError):
                await client.rset(timeout=None)
        raise
    body = raw if raw.endswith(b"\r\n") else raw + b"\r\n"
    if body.startswith(b"."):
        body = b"." + body
    protocol = client.protocol
    if protocol is None:
        raise aiosmtplib.SMTPServerDisconnected("Server not connected")
    # Nothing awaits between the write and read_response, so the reply cannot arrive
    # unclaimed (read_response marks it expected before it waits).
    protocol.write(body.replace(b"\r\n.", b"\r\n..") + b".\r\n")
    reply = await protocol.read_response(timeout=None)
    if reply.code != 250:
        raise aiosmtplib.SMTPDataError(reply.code, reply.message)

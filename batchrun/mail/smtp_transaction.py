"""One SMTP mail transaction (MAIL, RCPT, DATA) for a message batchrun built, on an open
aiosmtplib connection."""

from __future__ import annotations

import contextlib
import re

import aiosmtplib
from aiosmtplib.protocol import SMTPProtocol

# What aiosmtplib's execute_command refuses in an argument (a CR or LF would inject a
# command); an address holding one takes the sequential path, which raises ValueError.
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


async def transaction(client: aiosmtplib.SMTP, sender: str, rcpt: str, raw: bytes) -> None:
    """MAIL, RCPT and DATA for one message built by ``Message.to_bytes``.

    ``client.sendmail`` would parse both addresses twice and pass the message through two
    line-ending regexes and a dot-stuffing regex: ~230 µs of CPU for a 3.7 KB message,
    measured, as much as the rest of batchrun's work per user. Here the addresses were
    validated when the message was built, ``to_bytes`` writes CRLF lines already, and
    dot-stuffing is one ``bytes.replace``. Errors are aiosmtplib's own exceptions, raised
    as ``sendmail`` raises them (after RSET, so the connection stays usable). A non-ASCII
    address (SMTPUTF8) goes through ``sendmail``, which negotiates it.

    When the server offers PIPELINING (RFC 2920), MAIL, RCPT and DATA go out in one write
    and their three replies are read after it: one send and (usually) one wake-up instead
    of three, the largest cost per message against a fast server.
    """
    if not (sender.isascii() and rcpt.isascii()):
        options = ["SMTPUTF8"] if client.supports_extension("smtputf8") else []
        await client.sendmail(sender, [rcpt], raw, mail_options=options, timeout=None)
        return
    mail_from = b"FROM:<" + sender.encode("ascii") + b">"
    if client.supports_extension("size"):
        mail_from += b" SIZE=%d" % len(raw)
    rcpt_to = b"TO:<" + rcpt.encode("ascii") + b">"
    protocol = client.protocol
    if protocol is None:
        raise aiosmtplib.SMTPServerDisconnected("Server not connected")
    try:
        if (
            client.supports_extension("pipelining")
            and _can_pipeline(protocol)
            and not (_CONTROL.search(mail_from) or _CONTROL.search(rcpt_to))
        ):
            await _envelope_pipelined(client, protocol, mail_from, rcpt_to, sender, rcpt)
        else:
            await _envelope(client, mail_from, rcpt_to, sender, rcpt)
    except (aiosmtplib.SMTPResponseException, aiosmtplib.SMTPRecipientsRefused):
        if client.is_connected:  # a broken one is closed by the caller
            with contextlib.suppress(aiosmtplib.SMTPException, OSError):
                await client.rset(timeout=None)
        raise
    body = raw if raw.endswith(b"\r\n") else raw + b"\r\n"
    if body.startswith(b"."):
        body = b"." + body
    # Nothing awaits between the write and read_response, so the reply cannot arrive
    # unclaimed (read_response marks it expected before it waits).
    protocol.write(body.replace(b"\r\n.", b"\r\n..") + b".\r\n")
    reply = await protocol.read_response(timeout=None)
    if reply.code != 250:
        raise aiosmtplib.SMTPDataError(reply.code, reply.message)


async def _envelope(
    client: aiosmtplib.SMTP, mail_from: bytes, rcpt_to: bytes, sender: str, rcpt: str
) -> None:
    """MAIL, RCPT and DATA one after another, each reply read before the next command."""
    reply = await client.execute_command(b"MAIL", mail_from, timeout=None)
    if reply.code != 250:
        raise aiosmtplib.SMTPSenderRefused(reply.code, reply.message, sender)
    reply = await client.execute_command(b"RCPT", rcpt_to, timeout=None)
    if reply.code not in (250, 251):
        raise aiosmtplib.SMTPRecipientsRefused(
            [aiosmtplib.SMTPRecipientRefused(reply.code, reply.message, rcpt)]
        )
    reply = await client.execute_command(b"DATA", timeout=None)
    if reply.code != 354:
        raise aiosmtplib.SMTPDataError(reply.code, reply.message)


def _can_pipeline(protocol: SMTPProtocol) -> bool:
    """Whether this aiosmtplib keeps the bytes after a reply in its buffer, where the next
    replies of a pipelined group can be read from (the protocol of aiosmtplib 5)."""
    return hasattr(protocol, "_read_response_from_buffer") and hasattr(
        protocol, "_response_pending"
    )


async def _envelope_pipelined(
    client: aiosmtplib.SMTP,
    protocol: SMTPProtocol,
    mail_from: bytes,
    rcpt_to: bytes,
    sender: str,
    rcpt: str,
) -> None:
    """MAIL, RCPT and DATA in one write; then their three replies, in order.

    The protocol parses one reply per wait and keeps what follows it in its buffer, so
    the second and third replies are taken from the buffer when they already arrived,
    and waited for otherwise. Every reply is read before any error is raised, so the
    session stays in step for the RSET that follows an error. A 421 ends the reading:
    the server is closing the session.
    """
    protocol.write(b"MAIL " + mail_from + b"\r\nRCPT " + rcpt_to + b"\r\nDATA\r\n")
    replies = [await protocol.read_response(timeout=None)]
    while len(replies) < 3 and replies[-1].code != 421:
        reply = protocol._read_response_from_buffer()
        if reply is None:  # not arrived yet: wait for it as for any reply
            reply = await protocol.read_response(timeout=None)
        replies.append(reply)
    if len(replies) < 3:
        # A 421 before the last reply: the replies still owed can no longer be told from
        # the RSET's, so the session is closed (the caller replaces it).
        client.close()
        replies += [replies[-1]] * (3 - len(replies))
    mail, rcpt_reply, data = replies
    refused = mail.code != 250 or rcpt_reply.code not in (250, 251)
    if refused and data.code == 354:
        # A server that opened DATA for a transaction it refused: the session can only
        # be left by sending a message, so it is closed instead (the caller replaces it).
        client.close()
    if mail.code != 250:
        raise aiosmtplib.SMTPSenderRefused(mail.code, mail.message, sender)
    if rcpt_reply.code not in (250, 251):
        raise aiosmtplib.SMTPRecipientsRefused(
            [aiosmtplib.SMTPRecipientRefused(rcpt_reply.code, rcpt_reply.message, rcpt)]
        )
    if data.code != 354:
        raise aiosmtplib.SMTPDataError(data.code, data.message)

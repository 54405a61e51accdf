"""What DKIM signing costs per message (DKIM is off in ``make bench``).

Signs the birthday job's own message (bench/ceiling.py's ``sample_messages``: the full
template, ~3.7 KB) with ``batchrun.mail.dkim.DkimSigner`` (dkimpy's ``dkim.sign``,
rsa-sha256, relaxed/simple, its RSA step done by OpenSSL through ``cryptography``) for a
1024- and a 2048-bit key, and prints the fastest of a few rounds, in microseconds per
message; beside it, dkimpy on its own (pure-Python RSA) and the RSA step alone::

    python -m bench.dkim_cost [--rounds 5] [--messages 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from batchrun.mail.dkim import DkimSigner
from bench.ceiling import sample_messages


def best_us(work: Callable[[], object], *, rounds: int, count: int) -> float:
    """The fastest of ``rounds`` rounds of ``count`` calls, in µs per call."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(count):
            work()
        best = min(best, (time.perf_counter() - start) / count)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    ((_, raw),) = sample_messages(1)
    result: dict[str, object] = {"message_bytes": len(raw)}
    for bits in (1024, 2048):
        key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        signer = DkimSigner(pem, "bench", "localhost.example")  # OpenSSL's RSA step
        pure = DkimSigner(pem, "bench", "localhost.example", openssl=False)
        dkim_us = best_us(partial(signer.sign, raw), rounds=args.rounds, count=args.messages)
        pure_us = best_us(partial(pure.sign, raw), rounds=args.rounds, count=args.messages)
        rsa_sign = partial(key.sign, raw, padding.PKCS1v15(), hashes.SHA256())
        openssl_us = best_us(rsa_sign, rounds=args.rounds, count=args.messages)
        result[f"rsa{bits}"] = {
            "batchrun_us": round(dkim_us),
            "dkimpy_pure_us": round(pure_us),
            "openssl_rsa_us": round(openssl_us),
        }
        print(
            f"rsa-sha256 {bits}-bit, {len(raw):,}-byte message: DkimSigner {dkim_us:,.0f} us "
            f"(dkimpy with OpenSSL's RSA); dkimpy alone {pure_us:,.0f} us; "
            f"the RSA step alone {openssl_us:,.0f} us"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()

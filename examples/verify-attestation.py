#!/usr/bin/env python3
"""Verify a sealnode attestation with Python's `cryptography` package, as a gateway would.

    verify-attestation.py --pubkey KEY.pem (--nonce HEX | --no-nonce) [--expect NAME=SHA256 ...]
                          [--min-generation N] ENVELOPE.json

The envelope is DSSE (payloadType application/vnd.in-toto+json) holding an in-toto Statement
v1 with predicateType urn:sealnode:seal:v1, signed with ed25519 (docs/attestation.md). The exit
status is sealnode verify-attestation's: 0 verified, 10 bad signature, 11 wrong or missing
nonce, 12 an expectation not met, 13 not a sealnode attestation.
"""

import argparse
import base64
import binascii
import hashlib
import json
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "urn:sealnode:seal:v1"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def verify(envelope: dict, key: Ed25519PublicKey, nonce, expect, min_generation):
    """(exit status, lines saying what was verified or what failed)."""
    keyid = hashlib.sha256(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        return 13, [f"payloadType {envelope.get('payloadType')!r} is not {PAYLOAD_TYPE}"]
    try:
        body = base64.b64decode(envelope["payload"], validate=True)
    except (KeyError, binascii.Error) as e:
        return 13, [f"payload is not base64: {e}"]
    good = False
    for s in envelope.get("signatures", []):
        if s.get("keyid") != keyid:
            continue
        try:
            key.verify(base64.b64decode(s["sig"], validate=True), pae(PAYLOAD_TYPE, body))
            good = True
        except (InvalidSignature, KeyError, binascii.Error):
            pass
    if not good:
        return 10, [f"no valid signature by key {keyid}"]
    try:
        st = json.loads(body)
        p = st["predicate"]
    except (ValueError, KeyError, TypeError) as e:
        return 13, [f"the payload is not a statement: {e}"]
    if st.get("_type") != STATEMENT_TYPE or st.get("predicateType") != PREDICATE_TYPE:
        return 13, [f"_type {st.get('_type')!r} / predicateType {st.get('predicateType')!r}"]
    said = [f"signature: ed25519 key {keyid}"]
    got = p.get("nonce")
    if nonce is None:
        if got is not None:
            return 11, [f"the statement answers nonce {got}; --no-nonce accepts only the start-time one"]
        said.append("nonce: none (the statement written at start: not fresh)")
    elif got is None or got.lower() != nonce.lower():
        return 11, [f"the statement answers nonce {got}, not {nonce}"]
    else:
        said.append(f"nonce: {got}")
    bad = []
    if min_generation is not None and p["generation"] < min_generation:
        bad.append(f"generation {p['generation']} is older than {min_generation} (--min-generation)")
    subjects = {s["name"]: s["digest"].get("sha256") for s in st["subject"]}
    for name, digest in expect:
        if name not in subjects:
            bad.append(f"{name}: no such subject in the statement")
        elif (subjects[name] or "").lower() != digest.lower():
            bad.append(f"{name}: sha256 {subjects[name]}, expected {digest}")
        else:
            said.append(f"{name}: sha256 {digest} as expected")
    if bad:
        return 12, bad
    said.append(
        f"sealed: generation {p['generation']}, preflight {'passed' if p['preflight']['passed'] else 'FAILED'}, "
        f"kernel {p['host']['kernel_release']}, TPM {'bound' if p['tpm']['present'] else 'none'}"
    )
    return 0, said


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("envelope")
    ap.add_argument("--pubkey", required=True)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--nonce")
    g.add_argument("--no-nonce", action="store_true")
    ap.add_argument("--expect", action="append", default=[], metavar="NAME=SHA256")
    ap.add_argument("--min-generation", type=int)
    a = ap.parse_args()
    with open(a.pubkey, "rb") as f:
        key = load_pem_public_key(f.read())
    if not isinstance(key, Ed25519PublicKey):
        sys.exit(f"{a.pubkey}: not an ed25519 public key")
    with open(a.envelope, "rb") as f:
        try:
            envelope = json.load(f)
        except ValueError as e:
            print(f"{a.envelope}: NOT verified\n  not JSON: {e}")
            sys.exit(13)
    expect = [tuple(e.split("=", 1)) for e in a.expect]
    code, lines = verify(envelope, key, a.nonce, expect, a.min_generation)
    print(f"{a.envelope}: {'verified' if code == 0 else 'NOT verified'}")
    for line in lines:
        print(f"  {line}")
    sys.exit(code)


if __name__ == "__main__":
    main()

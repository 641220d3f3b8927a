#!/usr/bin/env python3
"""Verify a sealnode attestation with Python's `cryptography` package, as a gateway would.

    verify-attestation.py --pubkey KEY.pem (--nonce HEX | --no-nonce) [--expect NAME=SHA256 ...]
                          [--min-generation N] [--tpm-ak AK.pem] ENVELOPE.json

The envelope is DSSE (payloadType application/vnd.in-toto+json) holding an in-toto Statement
v1 with predicateType urn:sealnode:seal:v3, signed with ed25519 (docs/attestation.md). The exit
status is sealnode verify-attestation's: 0 verified, 10 bad signature, 11 wrong or missing
nonce, 12 an expectation not met, 13 not a sealnode attestation, 14 (with --tpm-ak) the TPM
quote is missing or does not bind the statement.
"""

import argparse
import base64
import binascii
import hashlib
import json
import re
import struct
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "urn:sealnode:seal:v3"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


class Malformed(Exception):
    pass


def strict_json(data: bytes):
    """UTF-8 JSON, no BOM, no duplicate keys, no lone surrogate escapes, -0 a float: what
    sealnode's (serde) parser accepts."""

    def pairs(kv):
        d = {}
        for k, v in kv:
            if k in d:
                raise Malformed(f"duplicate key {k!r}")
            d[k] = v
        return d

    def scan(x):
        if isinstance(x, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in x):
            raise Malformed("a string holds a lone surrogate")
        if isinstance(x, dict):
            for k, v in x.items():
                scan(k)
                scan(v)
        elif isinstance(x, list):
            for v in x:
                scan(v)

    try:
        v = json.loads(data.decode("utf-8"), object_pairs_hook=pairs, parse_int=lambda t: float(t) if t == "-0" else int(t))
        scan(v)
        return v
    except (UnicodeDecodeError, ValueError) as e:
        raise Malformed(f"not UTF-8 JSON: {e}") from e
    except RecursionError:
        raise Malformed("JSON nested too deep") from None


def same(a: str, b: str) -> bool:
    """Equal but for ASCII case, as Rust's eq_ignore_ascii_case (str.lower() folds more)."""
    return a.encode().lower() == b.encode().lower()


def b64(text) -> bytes:
    """Standard base64, padded and canonical (no stray bits), as sealnode decodes it."""
    if not isinstance(text, str):
        raise Malformed("not a base64 string")
    raw = base64.b64decode(text, validate=True)
    if base64.b64encode(raw).decode() != text:
        raise binascii.Error("not canonical base64")
    return raw


# The statement's schema (urn:sealnode:seal:v3), with the types sealnode's (serde) parser
# demands: exactly these members, none missing, none extra; "?" marks one that may be absent
# or null. Integers are JSON integers in the Rust type's range (never true/false).
U64, U32, I32 = (0, 2**64 - 1), (0, 2**32 - 1), (-(2**31), 2**31 - 1)
STR, BOOL = "str", "bool"
CONTAINER = {"runtime": STR, "version": "?str", "rootless": "?bool", "orchestrator": "?str", "evidence": [STR]}
HOST = {"kernel_release": STR, "landlock_abi": I32, "userns_mode": STR, "sealnode_version": STR, "container": ("?", CONTAINER)}
ROLE = {
    "generation": U64, "program": STR, "layers": [STR], "seccomp_instructions": U64, "refused_syscalls_logged": BOOL,
    "rlimits": {"*": U64}, "devices": [STR], "restarts": U32, "restarts_since_preflight": U32,
    "models_binding": "?bool",
}
PREFLIGHT_ROLE = {"attempts": U64, "refused": U64, "succeeded": U64, "refused_by": {"*": U64}}
PREDICATE = {
    "generation": U64, "nonce": "?str", "issued_at": U64, "started_at": U64, "boot_id": STR, "host": HOST,
    "roles": {"*": ROLE}, "preflight": {"passed": BOOL, "report_sha256": STR, "roles": {"*": PREFLIGHT_ROLE}},
    "limits": {"*": {"cgroup": STR, "files": {"*": STR}}},
    "tpm": {"present": BOOL, "pcr": ("?", U32), "ak": "?str", "note": "?str"},
}
STATEMENT = {"_type": STR, "subject": [{"name": STR, "digest": {"*": STR}}], "predicateType": STR, "predicate": PREDICATE}


def check(value, schema, where="statement"):
    """Raise Malformed unless `value` has `schema` (see above)."""
    optional = False
    if isinstance(schema, str) and schema.startswith("?"):
        optional, schema = True, schema[1:]
    elif isinstance(schema, tuple) and schema[0] == "?":
        optional, schema = True, schema[1]
    if optional and value is None:
        return
    if schema == STR:
        ok = isinstance(value, str)
    elif schema == BOOL:
        ok = isinstance(value, bool)
    elif isinstance(schema, tuple):
        ok = isinstance(value, int) and not isinstance(value, bool) and schema[0] <= value <= schema[1]
    elif isinstance(schema, list):
        ok = isinstance(value, list)
        for i, v in enumerate(value if ok else []):
            check(v, schema[0], f"{where}[{i}]")
    elif "*" in schema:
        ok = isinstance(value, dict)
        for k, v in (value.items() if ok else []):
            check(v, schema["*"], f"{where}.{k}")
    else:
        ok = isinstance(value, dict)
        if ok:
            required = {k for k, t in schema.items() if not (isinstance(t, str) and t.startswith("?")) and not (isinstance(t, tuple) and t[0] == "?")}
            if not (required <= set(value) <= set(schema)):
                raise Malformed(f"{where}: members {sorted(value)}")
            for k, v in value.items():
                check(v, schema[k], f"{where}.{k}")
    if not ok:
        raise Malformed(f"{where}: not of the type sealnode writes")


def check_shape(st):
    check(st, STATEMENT)


QUOTE = {"ak": STR, "pcrs": {"*": STR}, "attest": STR, "signature": STR}
ENVELOPE = {"payloadType": STR, "payload": STR, "signatures": [{"keyid": STR, "sig": STR}], "tpmQuote": ("?", QUOTE)}


# The TPM quote (docs/attestation.md, "TPM binding"): PCRs 0-7 and 23 of the sha256 bank.
PCR = 23
QUOTED = list(range(8)) + [PCR]


class TpmFailure(Exception):
    pass


def tpm2b(buf: bytes, at: int):
    if at + 2 > len(buf):
        raise TpmFailure("the quote ends inside a TPM2B")
    (n,) = struct.unpack_from(">H", buf, at)
    if at + 2 + n > len(buf):
        raise TpmFailure("the quote ends inside a TPM2B")
    return buf[at + 2 : at + 2 + n], at + 2 + n


def parse_attest(a: bytes):
    """(extraData, reset count, selected PCRs, pcrDigest) of a TPMS_ATTEST holding a quote."""
    if len(a) < 6:
        raise TpmFailure("the quote ends inside its header")
    magic, kind = struct.unpack_from(">IH", a, 0)
    if magic != 0xFF544347 or kind != 0x8018:
        raise TpmFailure("not a TPM quote (magic/type)")
    _, at = tpm2b(a, 6)  # qualifiedSigner
    extra, at = tpm2b(a, at)
    if at + 17 + 8 + 4 > len(a):
        raise TpmFailure("the quote ends inside clockInfo")
    _clock, resets, _restarts, _safe = struct.unpack_from(">QIIB", a, at)
    at += 17 + 8  # clockInfo, firmwareVersion
    (banks,) = struct.unpack_from(">I", a, at)
    at += 4
    if banks != 1 or at + 3 > len(a):
        raise TpmFailure(f"the quote selects {banks} PCR banks; sealnode's select one (sha256)")
    alg, size = struct.unpack_from(">HB", a, at)
    at += 3
    bits = a[at : at + size]
    at += size
    if alg != 0x000B:
        raise TpmFailure("the quote's PCR bank is not sha256")
    pcrs = [i * 8 + b for i, byte in enumerate(bits) for b in range(8) if byte & (1 << b)]
    digest, at = tpm2b(a, at)
    if at != len(a):
        raise TpmFailure("bytes follow the TPMS_ATTEST")
    return extra, resets, pcrs, digest


def verify_tpm(envelope, p, body: bytes, ak: ec.EllipticCurvePublicKey):
    """Lines saying what the quote binds; TpmFailure if it does not bind this statement."""
    der = ak.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    ak_id = hashlib.sha256(der).hexdigest()
    t = p["tpm"]
    if not t["present"]:
        raise TpmFailure("the statement says no TPM: it is bound to the signing key only")
    if t.get("pcr") != PCR:
        raise TpmFailure(f"the statement names PCR {t.get('pcr')}; sealnode's quotes hold the statement in PCR {PCR}")
    if not same(t.get("ak") or "", ak_id):
        raise TpmFailure(f"the statement names attestation key {t.get('ak')}, not the given one ({ak_id})")
    q = envelope.get("tpmQuote")
    if q is None:
        raise TpmFailure("the envelope carries no tpmQuote")
    if not same(q["ak"], ak_id):
        raise TpmFailure(f"the quote names attestation key {q['ak']}, not the given one ({ak_id})")
    try:
        attest, sig = b64(q["attest"]), b64(q["signature"])
    except (binascii.Error, ValueError):
        raise TpmFailure("tpmQuote.attest or .signature is not base64") from None
    if len(sig) < 4 or struct.unpack_from(">HH", sig, 0) != (0x0018, 0x000B):
        raise TpmFailure("the quote's signature is not ECDSA/sha256")
    r, at = tpm2b(sig, 4)
    s, at = tpm2b(sig, at)
    if at != len(sig) or len(r) > 32 or len(s) > 32:
        raise TpmFailure("the TPMT_SIGNATURE is not ECDSA P-256's r and s, and nothing after")
    try:
        ak.verify(encode_dss_signature(int.from_bytes(r, "big"), int.from_bytes(s, "big")), attest, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise TpmFailure(f"the quote's signature does not verify with attestation key {ak_id}") from None
    extra, resets, pcrs, digest = parse_attest(attest)
    want = hashlib.sha256(bytes.fromhex(p["nonce"])).digest() if p["nonce"] is not None else b""
    if extra != want:
        raise TpmFailure("the quote was made for another nonce (a replayed quote?)")
    if pcrs != QUOTED:
        raise TpmFailure(f"the quote selects PCRs {pcrs}; sealnode's select {QUOTED}")
    values = q["pcrs"]
    if set(values) != {str(n) for n in QUOTED}:
        raise TpmFailure("tpmQuote.pcrs does not hold exactly the quoted PCRs")
    if not all(re.fullmatch(r"[0-9a-fA-F]{64}", values[str(n)]) for n in QUOTED):
        raise TpmFailure("a PCR value is not 32 bytes of hex")
    raw = {n: bytes.fromhex(values[str(n)]) for n in QUOTED}
    if hashlib.sha256(b"".join(raw[n] for n in QUOTED)).digest() != digest:
        raise TpmFailure("the PCR values given are not the ones the TPM quoted (pcrDigest differs)")
    if raw[PCR] != hashlib.sha256(b"\0" * 32 + hashlib.sha256(body).digest()).digest():
        raise TpmFailure(f"PCR {PCR} does not hold this statement's digest: the quote is not over this statement")
    return [
        f"TPM: quote by attestation key {ak_id}, PCR {PCR} holds this statement's digest",
        f"TPM: reset count {resets} (its boot cycles, if the key is in the endorsement hierarchy); boot PCRs "
        + " ".join(f"{n}={raw[n].hex()}" for n in range(8)),
    ]


def verify(data: bytes, key: Ed25519PublicKey, nonce, expect, min_generation, tpm_ak=None):
    """(exit status, lines saying what was verified or what failed)."""
    try:
        return verify_strict(data, key, nonce, expect, min_generation, tpm_ak)
    except TpmFailure as e:
        return 14, [str(e)]
    except (Malformed, KeyError, TypeError, AttributeError, binascii.Error, ValueError, struct.error) as e:
        return 13, [f"not a sealnode attestation: {e}"]


def verify_strict(data: bytes, key: Ed25519PublicKey, nonce, expect, min_generation, tpm_ak=None):
    keyid = hashlib.sha256(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()
    envelope = strict_json(data)
    # The envelope's members, as sealnode's parser takes them: DSSE's three and an optional
    # tpmQuote (null is the same as absent), each of its type, nothing else.
    check(envelope, ENVELOPE, "envelope")
    if envelope.get("tpmQuote") is None:
        envelope.pop("tpmQuote", None)
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        return 13, [f"payloadType {envelope.get('payloadType')!r} is not {PAYLOAD_TYPE}"]
    body = b64(envelope["payload"])
    sigs = envelope["signatures"]
    good = False
    for s in sigs:
        if s["keyid"] != keyid:
            continue
        try:
            key.verify(b64(s["sig"]), pae(PAYLOAD_TYPE, body))
            good = True
        except (InvalidSignature, binascii.Error, ValueError):
            pass
    if not good:
        return 10, [f"no valid signature by key {keyid}"]
    st = strict_json(body)
    check_shape(st)
    names = [s["name"] for s in st["subject"]]
    if len(set(names)) != len(names):
        raise Malformed("a subject is listed twice")
    p = st["predicate"]
    if st.get("_type") != STATEMENT_TYPE or st.get("predicateType") != PREDICATE_TYPE:
        return 13, [f"_type {st.get('_type')!r} / predicateType {st.get('predicateType')!r}"]
    said = [f"signature: ed25519 key {keyid}"]
    got = p.get("nonce")
    if nonce is None:
        if got is not None:
            return 11, [f"the statement answers nonce {got}; --no-nonce accepts only the start-time one"]
        said.append("nonce: none (the statement written at start: not fresh)")
    elif got is None or not same(got, nonce):
        return 11, [f"the statement answers nonce {got}, not {nonce}"]
    else:
        said.append(f"nonce: {got}")
    if tpm_ak is not None:
        said.extend(verify_tpm(envelope, p, body, tpm_ak))
    elif "tpmQuote" in envelope:
        said.append("TPM: a quote is attached, not checked (give --tpm-ak)")
    bad = []
    if min_generation is not None and p["generation"] < min_generation:
        bad.append(f"generation {p['generation']} is older than {min_generation} (--min-generation)")
    subjects = {s["name"]: s["digest"].get("sha256") for s in st["subject"]}
    models_bind = p["roles"].get("engine", {}).get("models_binding") is not False
    for name, digest in expect:
        if not models_bind and (name.startswith("model:") or name.startswith("model-hex:")):
            bad.append(f"{name}: the statement says the engine's model digests do not bind (models_writable: the engine may change them)")
        elif name not in subjects:
            bad.append(f"{name}: no such subject in the statement")
        elif not same(subjects[name] or "", digest):
            bad.append(f"{name}: sha256 {subjects[name]}, expected {digest}")
        else:
            said.append(f"{name}: sha256 {digest} as expected")
    if bad:
        return 12, bad
    said.append(
        f"sealed: generation {p['generation']}, preflight {'passed' if p['preflight']['passed'] else 'FAILED'}, "
        f"kernel {p['host']['kernel_release']}, TPM "
        + ("none" if not p["tpm"]["present"] else "bound (quote verified)" if tpm_ak is not None else "present (quote not checked)")
    )
    return 0, said


class Once(argparse.Action):
    """An option given at most once, as sealnode's command line takes it."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, "_seen_" + self.dest, False):
            parser.error(f"{option_string} given more than once")
        setattr(namespace, "_seen_" + self.dest, True)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def u64(text):
    """A u64 as Rust parses one: an optional +, ASCII digits, in range."""
    if not re.fullmatch(r"\+?[0-9]+", text) or int(text) > U64[1]:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number from 0 to {U64[1]}")
    return int(text)


def pem_only(data: bytes) -> bytes:
    """One PEM public key block and nothing else around it (sealnode's parser is strict)."""
    text = data.decode("ascii", "strict").strip()
    if not (text.startswith("-----BEGIN PUBLIC KEY-----") and text.endswith("-----END PUBLIC KEY-----")) or text.count("-----BEGIN") != 1:
        raise ValueError("not one PEM public key block")
    return text.encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("envelope")
    ap.add_argument("--pubkey", required=True, action=Once)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--nonce", action=Once)
    g.add_argument("--no-nonce", action=Once, nargs=0, default=False)
    ap.add_argument("--expect", action="append", default=[], metavar="NAME=SHA256")
    ap.add_argument("--min-generation", type=u64, action=Once)
    ap.add_argument("--tpm-ak", action=Once, help="the TPM attestation key the gateway enrolled (PEM)")
    a = ap.parse_args()
    # As sealnode's: a bad nonce or --expect is a usage error (2), a file or key that cannot be
    # read is 125.
    if a.nonce is not None and not re.fullmatch(r"(?:[0-9a-fA-F]{2}){8,64}", a.nonce):
        ap.error(f"the nonce {a.nonce!r} is not 8 to 64 bytes of hex")
    if any("=" not in e for e in a.expect):
        ap.error("--expect: expected NAME=SHA256")

    def read(path):
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            print(f"{path}: {e}", file=sys.stderr)
            sys.exit(125)

    def load(path, what, ok, raw_hex=False):
        data = read(path)
        try:
            text = data.decode("ascii").strip()
            if raw_hex and re.fullmatch(r"[0-9a-fA-F]{64}", text):
                k = Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
            else:
                k = load_pem_public_key(pem_only(data))
        except ValueError as e:
            print(f"{path}: {e}", file=sys.stderr)
            sys.exit(125)
        if not ok(k):
            print(f"{path}: not an {what} public key", file=sys.stderr)
            sys.exit(125)
        return k

    key = load(a.pubkey, "ed25519", lambda k: isinstance(k, Ed25519PublicKey), raw_hex=True)
    data = read(a.envelope)
    ak = None
    if a.tpm_ak:
        ak = load(a.tpm_ak, "ECDSA P-256", lambda k: isinstance(k, ec.EllipticCurvePublicKey) and k.curve.name == "secp256r1")
    expect = [tuple(e.split("=", 1)) for e in a.expect]
    code, lines = verify(data, key, a.nonce, expect, a.min_generation, ak)
    print(f"{a.envelope}: {'verified' if code == 0 else 'NOT verified'}")
    for line in lines:
        print(f"  {line}")
    sys.exit(code)


if __name__ == "__main__":
    main()

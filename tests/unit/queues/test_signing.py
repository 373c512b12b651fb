"""The signing contract: Sluice and a JavaScript producer agree byte for byte, both ways."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sluice.queues.signing import MissingSecret, Signer, canonical, js_number, js_stringify

NODE_SCRIPT = Path(__file__).resolve().parents[2] / "js_signing.js"
SECRET = "queue-secret-for-tests-0123456789"
OLD_SECRET = "older-queue-secret-0123456789abc"

# Message texts as a producer would send them; each is parsed by both sides.
VECTORS = [
    ('{"topic":"rss.ingest","batchId":"b-1","sourceId":"all-sources","feedUrl":"",'
     '"publishedAt":"2026-11-29T03:16:00.000Z"}'),
    # non-ASCII, escapes, control characters, a lone surrogate, an astral character
    ('{"topic":"rss.ingest","batchId":"b-\u00e9\u4e2d\ud83d\ude00","sourceId":"caf\u00e9 \\"q\\" \\\\",'
     '"feedUrl":"https://example.com/\u00fc?a=1&b=<2>","note":"tab\\tnl\\nnul\\u0000del\\u007f'
     '\\u2028\\u2029\\ud800x\\udfff","publishedAt":"2026-11-29T03:16:00Z"}'),
    # nested objects keep their order (integer-like keys first, as a JS engine orders them)
    ('{"topic":"rss.ingest","batchId":"b-2","meta":{"z":1,"a":{"y":[1,2,{"k":null}],"b":true},'
     '"10":"ten","2":"two","-1":"neg","01":"lead"},"sourceId":"s","feedUrl":"f","publishedAt":"p"}'),
    # arrays, integers, fractions, booleans and null
    ('{"topic":"rss.ingest","batchId":"b-3","counts":[0,-0,1,-1,9007199254740993,1e21,1e20,'
     '123456789012345678901234567890],"fractions":[1.0,1.5,-2.25,0.1,1e-7,0.000001,5e-324,'
     '1.7976931348623157e308,3.14159265358979,2.5e-8,100.0e-2],"flags":[true,false,null],'
     '"empty":{},"none":null,"yes":true,"sourceId":"s","feedUrl":"f","publishedAt":"p"}'),
    # keys whose sort order depends on JS's String([k, v]) comparison and on UTF-16 units
    ('{"a":1,"a!":2,"a,b":3,"a,":4,"b":[1,[2,3]],"\ue000":"pua","\ud83d\ude00":"astral",'
     '"A":0,"_":"u","topic":"rss.ingest","batchId":"b-4"}'),
    # a signature already present is excluded from the input
    ('{"topic":"rss.ingest","batchId":"b-5","signature":"00","sourceId":"s","feedUrl":"",'
     '"publishedAt":"p"}'),
]


def run_node(cases: list[dict[str, str]]) -> list[dict[str, Any]]:
    done = subprocess.run(["node", str(NODE_SCRIPT)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=30, check=True)
    result: list[dict[str, Any]] = json.loads(done.stdout)
    return result


def test_canonical_input_and_signature_match_javascript_byte_for_byte() -> None:
    js = run_node([{"secret": SECRET, "text": text} for text in VECTORS])
    signer = Signer([SECRET])
    for text, expected in zip(VECTORS, js, strict=True):
        message = json.loads(text)
        assert canonical(message).decode("utf-8") == expected["canonical"], text
        assert signer.signature(message) == expected["signature"], text


def test_javascript_signed_messages_verify_in_sluice() -> None:
    js = run_node([{"secret": SECRET, "text": text} for text in VECTORS])
    signer = Signer([SECRET])
    for text, expected in zip(VECTORS, js, strict=True):
        message = json.loads(text)
        message["signature"] = expected["signature"]
        assert signer.check(message) is None


def test_sluice_signed_messages_verify_in_javascript() -> None:
    signer = Signer([SECRET])
    signed = [json.dumps(signer.sign(json.loads(text)), ensure_ascii=False) for text in VECTORS]
    tampered = [json.dumps({**json.loads(s), "batchId": "other"}) for s in signed]
    js = run_node([{"secret": SECRET, "text": s} for s in signed + tampered])
    assert [r["valid"] for r in js] == [True] * len(signed) + [False] * len(tampered)


@pytest.mark.parametrize(("value", "expected"), [
    (1.0, "1"), (-0.0, "0"), (1e21, "1e+21"), (1e20, "100000000000000000000"),
    (1e-7, "1e-7"), (0.000001, "0.000001"), (1.5e300, "1.5e+300"), (float("inf"), "null"),
    (float("nan"), "null"), (2**53, "9007199254740992"), (10**400, "null"), (-2.5, "-2.5"),
])
def test_numbers_are_written_as_ecmascript_writes_them(value: float, expected: str) -> None:
    assert js_number(value) == expected


def test_strings_escape_only_what_javascript_escapes() -> None:
    assert js_stringify("é\u2028\"\\\x01\x7f\ud800") == '"é\u2028\\"\\\\\\u0001\x7f\\ud800"'


def test_rotation_signs_with_the_first_secret_and_accepts_any() -> None:
    message = {"topic": "rss.ingest", "batchId": "b"}
    old = Signer([OLD_SECRET]).sign(message)
    rotated = Signer([SECRET, OLD_SECRET])
    assert rotated.check(old) is None
    assert rotated.sign(message)["signature"] == Signer([SECRET]).signature(message)
    assert Signer([SECRET]).check(old) == "signature does not match"


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda m: m.pop("signature"), "message is unsigned"),
    (lambda m: m.update(signature=m["signature"][:-2]), "signature has the wrong length"),
    (lambda m: m.update(signature=m["signature"].upper()), "signature does not match"),
    (lambda m: m.update(batchId="b-other"), "signature does not match"),
    (lambda m: m.update(extra=1), "signature does not match"),
    (lambda m: m.update(signature="\u00e9" * 32), "signature does not match"),
])
def test_forged_tampered_and_unsigned_messages_fail(mutate: Any, reason: str) -> None:
    signer = Signer([SECRET])
    message = signer.sign({"topic": "rss.ingest", "batchId": "b", "n": 1})
    mutate(message)
    assert signer.check(message) == reason


def test_field_order_does_not_change_the_signature() -> None:
    signer = Signer([SECRET])
    a = signer.sign({"topic": "t", "batchId": "b", "x": 1})
    b = {"x": 1, "signature": a["signature"], "batchId": "b", "topic": "t"}
    assert signer.check(b) is None
    assert signer.check({**a, "x": {"p": 1, "q": 2}}) != signer.check(a)


def test_no_secret_fails_closed() -> None:
    signer = Signer([])
    with pytest.raises(MissingSecret):
        signer.sign({"topic": "t"})
    forged = Signer([SECRET]).sign({"topic": "t"})
    assert signer.check(forged) == "no signing secret is configured"
    assert signer.check("not an object") == "no signing secret is configured"
    assert Signer([SECRET]).check(["not", "an", "object"]) == "message is not a JSON object"

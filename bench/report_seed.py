#!/usr/bin/env python3
"""Seeds the provider side of the report benchmark: payment intents created through the
simulator's /v1 API (one keep-alive connection, no idempotency keys), spread over a week of sim
time by advancing the sim clock every `--per-step` objects. Prints the sim time the first
object was created at (unix seconds); report.sh seeds the attempts by SQL on the same timeline.

Standard library only. Objects are created through /v1, the way chargeguard's own creates reach
the simulator.
"""
import argparse
import hashlib
import http.client
import json
import sys
import urllib.parse
import uuid


def attempt_id(index):
    # The same as PostgreSQL's md5('bench-' || index)::uuid in report.sh.
    return str(uuid.UUID(hashlib.md5(b"bench-%d" % index).hexdigest()))


def refund_attempt_id(index):
    # The same as PostgreSQL's md5('bench-refund-' || index)::uuid in report.sh.
    return str(uuid.UUID(hashlib.md5(b"bench-refund-%d" % index).hexdigest()))


def refund_of(index, every):
    """The amount report.sh's refund attempt of charge `index` refunds: every `every`-th charge
    fully, the one three after it partly (300 of 1000); None for the others."""
    if index % every == 0:
        return 1000
    if index % every == 3:
        return 300
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--attempts", type=int, required=True)
    parser.add_argument("--per-step", type=int, default=100)
    parser.add_argument("--step-seconds", type=int, default=605)
    parser.add_argument("--orphans", type=int, default=100)
    parser.add_argument("--amount-mismatch-every", type=int, default=1000)
    parser.add_argument("--refund-every", type=int, default=10)
    parser.add_argument("--api-key", default="sk_test_chargeguard")
    args = parser.parse_args()

    connection = http.client.HTTPConnection("127.0.0.1", args.port)

    def call(method, path, body=None, content_type="application/x-www-form-urlencoded"):
        headers = {"Authorization": "Bearer " + args.api_key}
        if body is not None:
            headers["Content-Type"] = content_type
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        payload = response.read()
        if response.status != 200:
            sys.exit("%s %s: %d %s" % (method, path, response.status, payload[:300]))
        return json.loads(payload)

    def create(amount, metadata):
        fields = {"amount": str(amount), "currency": "usd", "confirm": "true", "payment_method": "pm_card_visa"}
        for key, value in metadata.items():
            fields["metadata[%s]" % key] = value
        return call("POST", "/v1/payment_intents", urllib.parse.urlencode(fields))

    def refund(payment_intent, amount, metadata):
        fields = {"payment_intent": payment_intent, "amount": str(amount)}
        for key, value in metadata.items():
            fields["metadata[%s]" % key] = value
        call("POST", "/v1/refunds", urllib.parse.urlencode(fields))

    start = call("GET", "/_sim/clock")["now"]
    for index in range(args.attempts):
        # Every n-th object is for another amount than its attempt asked: amount mismatches.
        amount = 1001 if index % args.amount_mismatch_every == 7 else 1000
        intent = create(amount, {
            "chargeguard_attempt_id": attempt_id(index),
            "chargeguard_consumer": "bench",
            "chargeguard_operation_key": "bench-%d" % index,
        })
        refunded = refund_of(index, args.refund_every)
        if refunded is not None and amount == 1000:
            refund(intent["id"], refunded, {
                "chargeguard_attempt_id": refund_attempt_id(index),
                "chargeguard_consumer": "bench",
                "chargeguard_operation_key": "bench-%d:refund-1" % index,
            })
        if index % args.per_step == args.per_step - 1:
            call("POST", "/_sim/clock/advance", json.dumps({"seconds": args.step_seconds}), "application/json")
    for _ in range(args.orphans):
        create(700, {})
    print(start)


if __name__ == "__main__":
    main()

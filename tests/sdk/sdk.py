"""Signs or verifies one webhook delivery with the provider's own PyPI SDK.

Reads one JSON request on stdin, writes one JSON answer on stdout (README.md).
"""
import json
import logging
import sys
import time
from types import SimpleNamespace


def header(req, name):
    """A request header by name, whatever its case."""
    want = name.lower()
    return next((v for k, v in (req.get("headers") or {}).items() if k.lower() == want), None)


def check(what, run):
    """Runs an SDK verifier: True passes; False or an exception fails with a message."""
    try:
        ok = run()
    except Exception as e:  # the SDK's own error, reported as is
        return {"valid": False, "error": f"{what}: {type(e).__name__}: {e}"}
    return {"valid": True} if ok is not False else {"valid": False, "error": f"{what} returned False"}


def verify_only(req):
    if req["op"] != "verify":
        raise ValueError(f"{req['provider']}: the SDK only verifies")


def standard(req):
    """Standard Webhooks' own Python library (what a consumer of the relay's signed deliveries runs)."""
    from standardwebhooks.webhooks import Webhook

    wh = Webhook(req["secret"])
    if req["op"] == "sign":
        raise ValueError("standard: only the verifier is wanted here")
    return check("Webhook.verify", lambda: wh.verify(req["body"], req.get("headers") or {}))


def slack(req):
    from slack_sdk.signature import SignatureVerifier

    verifier = SignatureVerifier(req["secret"])
    if req["op"] == "sign":
        ts = req.get("timestamp") or str(int(time.time()))
        sig = verifier.generate_signature(timestamp=ts, body=req["body"])
        return {"headers": {"X-Slack-Signature": sig, "X-Slack-Request-Timestamp": ts}}
    return check("is_valid_request", lambda: verifier.is_valid_request(req["body"], req.get("headers") or {}))


def hubspot(req):
    from hubspot.utils.signature import Signature

    if req["op"] == "sign":
        ts = req.get("timestamp") or str(int(time.time() * 1000))
        sig = Signature.get_signature(
            req["secret"], req["body"], "v3", http_uri=req["url"], http_method="POST", timestamp=ts
        )
        return {"headers": {"X-HubSpot-Signature-v3": sig, "X-HubSpot-Request-Timestamp": ts}}
    return check("Signature.is_valid", lambda: Signature.is_valid(
        header(req, "X-HubSpot-Signature-v3") or "", req["secret"], req["body"], http_uri=req["url"],
        http_method="POST", signature_version="v3", timestamp=header(req, "X-HubSpot-Request-Timestamp"),
    ))


def square(req):
    verify_only(req)
    from square.utils.webhooks_helper import verify_signature

    return check("verify_signature", lambda: verify_signature(
        request_body=req["body"], signature_header=header(req, "X-Square-Hmacsha256-Signature") or "",
        signature_key=req["secret"], notification_url=req["url"],
    ))


class _Messages(logging.Handler):
    """Keeps the Paddle verifier's log lines: they are its only reason for a False."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def paddle(req):
    verify_only(req)
    from paddle_billing.Notifications import Secret, Verifier

    messages = _Messages()
    logging.getLogger("paddle_billing").addHandler(messages)
    # The verifier reads request.headers.get("Paddle-Signature") and request.body (bytes).
    request = SimpleNamespace(
        body=req["body"].encode("utf-8"),
        headers={"Paddle-Signature": header(req, "Paddle-Signature")},
    )
    result = check("Verifier.verify", lambda: Verifier().verify(request, Secret(req["secret"])))
    if not result["valid"] and messages.lines:
        result["error"] += ": " + "; ".join(messages.lines)
    return result


def razorpay(req):
    verify_only(req)
    import razorpay as rzp

    return check("verify_webhook_signature", lambda: rzp.Utility().verify_webhook_signature(
        req["body"], header(req, "X-Razorpay-Signature") or "", req["secret"]
    ))


def gocardless(req):
    verify_only(req)
    from gocardless_pro import webhooks

    # parse() verifies, then reads the body's "events" array.
    return check("webhooks.parse", lambda: webhooks.parse(req["body"], req["secret"], header(req, "Webhook-Signature") or ""))


def coinbase(req):
    from coinbase_commerce.webhook import WebhookSignature

    if req["op"] == "sign":
        # The SDK's own (underscore-named) signer, the one verify_sig_header calls.
        return {"headers": {"X-CC-Webhook-Signature": WebhookSignature._compute_signature(req["body"], req["secret"])}}
    return check("verify_sig_header", lambda: WebhookSignature.verify_sig_header(
        req["body"], header(req, "X-CC-Webhook-Signature") or "", req["secret"]
    ))


PROVIDERS = {
    "slack": slack,
    "hubspot": hubspot,
    "square": square,
    "paddle": paddle,
    "razorpay": razorpay,
    "gocardless": gocardless,
    "coinbase": coinbase,
    "standard": standard,
}


def main():
    req = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    run = PROVIDERS.get(req.get("provider"))
    if run is None:
        raise ValueError(f"unknown provider: {req.get('provider')}")
    if req.get("op") not in ("sign", "verify"):
        raise ValueError(f"unknown op: {req.get('op')}")
    sys.stdout.write(json.dumps(run(req)) + "\n")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        print(f"sdk.py: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)

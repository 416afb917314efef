// Signs or verifies one webhook delivery with the provider's own npm SDK.
// Reads one JSON request on stdin, writes one JSON answer on stdout (README.md).
import { randomUUID } from "node:crypto";
import { parse as parseForm } from "node:querystring";

// A request header by name, whatever its case.
function header(req, name) {
  const want = name.toLowerCase();
  for (const [k, v] of Object.entries(req.headers ?? {})) if (k.toLowerCase() === want) return v;
  return undefined;
}

// Runs an SDK verifier: true passes; false or a throw fails with a message.
async function check(what, run) {
  try {
    return (await run()) === false ? { valid: false, error: `${what} returned false` } : { valid: true };
  } catch (e) {
    return { valid: false, error: `${what}: ${e?.message ?? e}` };
  }
}

async function stripe(req) {
  const { default: Stripe } = await import("stripe");
  if (req.op === "sign") {
    const timestamp = req.timestamp ? Number(req.timestamp) : undefined;
    return { headers: { "Stripe-Signature": Stripe.webhooks.generateTestHeaderString({ payload: req.body, secret: req.secret, timestamp }) } };
  }
  return check("constructEvent", () => Stripe.webhooks.constructEvent(req.body, header(req, "Stripe-Signature"), req.secret));
}

async function github(req) {
  const { sign, verify } = await import("@octokit/webhooks-methods");
  if (req.op === "sign") return { headers: { "X-Hub-Signature-256": await sign(req.secret, req.body) } };
  return check("verify", () => verify(req.secret, req.body, header(req, "X-Hub-Signature-256")));
}

// Form bodies are parsed as Express's urlencoded parser does (repeated keys give arrays);
// a URL carrying bodySHA256 means a JSON body, signed over the URL alone.
async function twilio(req) {
  const { default: tw } = await import("twilio");
  const jsonBody = req.url.includes("bodySHA256");
  if (req.op === "sign") {
    return { headers: { "X-Twilio-Signature": tw.getExpectedTwilioSignature(req.secret, req.url, jsonBody ? {} : parseForm(req.body)) } };
  }
  const signature = header(req, "X-Twilio-Signature");
  const algorithm = tw.getSignatureAlgorithm(header(req, "X-Twilio-Webhooks-Signature-Settings"));
  if (jsonBody) return check("validateRequestWithBody", () => tw.validateRequestWithBody(req.secret, signature, req.url, req.body, algorithm));
  return check("validateRequest", () => tw.validateRequest(req.secret, signature, req.url, parseForm(req.body), algorithm));
}

// Verify only: the SDK has no signer. It checks the body's webhookTimestamp (ms, ±60 s).
async function linear(req) {
  if (req.op !== "verify") throw new Error("linear: the SDK only verifies");
  const { LinearWebhookClient } = await import("@linear/sdk/webhooks");
  return check("LinearWebhookClient.verify", () =>
    new LinearWebhookClient(req.secret).verify(Buffer.from(req.body, "utf8"), header(req, "Linear-Signature")));
}

// Standard Webhooks, branded (svix-* headers, package svix) or not (webhook-*, package standardwebhooks).
async function standardWebhooks(req, pkg, prefix) {
  const { Webhook } = await import(pkg);
  const wh = new Webhook(req.secret);
  if (req.op === "sign") {
    const id = header(req, `${prefix}-id`) ?? `msg_${randomUUID().replaceAll("-", "")}`;
    const date = req.timestamp ? new Date(Number(req.timestamp) * 1000) : new Date();
    return {
      headers: {
        [`${prefix}-id`]: id,
        [`${prefix}-timestamp`]: String(Math.floor(date.getTime() / 1000)),
        [`${prefix}-signature`]: wh.sign(id, date, req.body),
      },
    };
  }
  return check("Webhook.verify", () => { wh.verify(req.body, req.headers ?? {}); });
}

// SendGrid's SDK only verifies. Signing is SendGrid's private key's job: here, Node's
// crypto with a test key (`private_key`, PKCS#8 base64), ECDSA P-256 over timestamp + body.
async function sendgrid(req) {
  if (req.op === "sign") {
    const { createPrivateKey, sign } = await import("node:crypto");
    const key = createPrivateKey({ key: Buffer.from(req.private_key, "base64"), format: "der", type: "pkcs8" });
    const timestamp = req.timestamp ?? String(Math.floor(Date.now() / 1000));
    const signature = sign("sha256", Buffer.from(timestamp + req.body, "utf8"), { key, dsaEncoding: "der" });
    return {
      headers: {
        "X-Twilio-Email-Event-Webhook-Signature": signature.toString("base64"),
        "X-Twilio-Email-Event-Webhook-Timestamp": timestamp,
      },
    };
  }
  const { EventWebhook } = await import("@sendgrid/eventwebhook");
  const ew = new EventWebhook();
  return check("EventWebhook.verifySignature", () =>
    ew.verifySignature(
      ew.convertPublicKeyToECDSA(req.secret),
      req.body,
      header(req, "X-Twilio-Email-Event-Webhook-Signature"),
      header(req, "X-Twilio-Email-Event-Webhook-Timestamp"),
    ));
}

const providers = {
  stripe,
  sendgrid,
  github,
  twilio,
  linear,
  svix: (req) => standardWebhooks(req, "svix", "svix"),
  clerk: (req) => standardWebhooks(req, "svix", "svix"),
  resend: (req) => standardWebhooks(req, "svix", "svix"),
  standard: (req) => standardWebhooks(req, "standardwebhooks", "webhook"),
};

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const req = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const run = providers[req.provider];
  if (!run) throw new Error(`unknown provider: ${req.provider}`);
  if (req.op !== "sign" && req.op !== "verify") throw new Error(`unknown op: ${req.op}`);
  process.stdout.write(JSON.stringify(await run(req)) + "\n");
}

main().catch((e) => {
  process.stderr.write(`sdk.mjs: ${e?.stack ?? e}\n`);
  process.exit(2);
});

// The console in a real browser (Debian's Chromium, driven by playwright-core),
// against an `inbox dev` that inbox/tests/console.rs started and filled:
//   CONSOLE_URL        the console's root, e.g. http://127.0.0.1:9000/console
//   OPERATOR, OPERATOR_PASSWORD, VIEWER, VIEWER_PASSWORD
//   FAILED_PROVIDER, FAILED_ID    an event that failed and succeeds when replayed
//   HOSTILE_ID                    a stripe event whose id and payload carry <script>, <img onerror>, javascript:
//   SCREENSHOTS                   where to write the screenshots the docs show (docs/console-*.png)
// Prints one line per check; exits non-zero at the first that fails.
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { chromium } from 'playwright-core';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const url = env('CONSOLE_URL');
const shots = env('SCREENSHOTS');
mkdirSync(shots, { recursive: true });
const eventUrl = (provider, id) => `${url}/event?${new URLSearchParams({ provider, id })}`;
const check = (what) => console.log(`ok: ${what}`);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});

/** A context whose every dialog, console error and page error is a problem. */
async function context(options = {}) {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 }, ...options });
  ctx.problems = [];
  ctx.on('page', (page) => watch(ctx, page));
  return ctx;
}
function watch(ctx, page) {
  page.on('dialog', (d) => { ctx.problems.push(`a dialog opened: ${d.message()}`); d.dismiss().catch(() => {}); });
  page.on('console', (m) => { if (m.type() === 'error') ctx.problems.push(`console error: ${m.text()}`); });
  page.on('pageerror', (e) => ctx.problems.push(`page error: ${e.message}`));
}
function noProblems(ctx, where) {
  assert.deepEqual(ctx.problems, [], `${where}: no dialog, console error or page error`);
}

async function signIn(page, name, password, { keyboard = false } = {}) {
  await page.goto(`${url}/events`);
  assert.match(page.url(), /\/signin\?next=/, 'a page needs a session: sent to sign in, and back afterwards');
  if (keyboard) {
    // Keyboard only: the name field has the focus, Tab to the password, Enter submits.
    await page.locator('#name:focus').waitFor({ timeout: 5000 });
    await page.keyboard.type(name);
    await page.keyboard.press('Tab');
    await page.keyboard.type(password);
    await page.keyboard.press('Enter');
  } else {
    await page.fill('#name', name);
    await page.fill('#password', password);
    await page.click('button[type=submit]');
  }
  await page.waitForURL(/\/events/);
  await page.getByRole('table').waitFor();
}

try {
  // ---- the operator, with JavaScript off: the console needs none ----
  const op = await context({ javaScriptEnabled: false });
  const page = await op.newPage();

  await page.goto(`${url}/events`);
  await page.fill('#name', env('OPERATOR'));
  await page.fill('#password', 'not the password');
  await page.click('button[type=submit]');
  assert.match(await page.locator('[role=alert]').innerText(), /do not match/, 'a wrong password is refused');
  assert.deepEqual(op.problems, ['console error: Failed to load resource: the server responded with a status of 401 (Unauthorized)'],
    'the refused sign-in is answered 401');
  op.problems.length = 0;
  check('a wrong password is refused, with a clear message');

  await signIn(page, env('OPERATOR'), env('OPERATOR_PASSWORD'));
  assert.equal(await page.locator('#live').getAttribute('data-state'), 'off', 'without JavaScript the page is as sent');
  check('the operator signs in (JavaScript off)');

  // Filter to the failed event: provider and status, through the form.
  const provider = env('FAILED_PROVIDER');
  const failedId = env('FAILED_ID');
  await page.fill('#provider', provider);
  await page.check('input[name=status][value=failed]');
  await page.click('.filters button[type=submit]');
  await page.waitForURL(/status=failed/);
  const rows = page.locator('table.events tbody tr');
  assert.equal(await rows.count(), 1, 'one failed event of that provider');
  assert.equal(await rows.first().locator('td.id').innerText(), failedId);
  check('the listing filters to the failed event');

  // Open it and read its reason.
  await rows.first().locator('td.id a').click();
  await page.waitForURL(/\/event\?/);
  const reason = await page.locator('#failure-reason').innerText();
  assert.match(reason, /does not exist yet/, `its failure reason: ${reason}`);
  assert.equal(await page.locator('h1 .status').innerText(), 'failed');
  await page.screenshot({ path: `${shots}/console-event.png`, fullPage: true });
  check(`the event page shows the reason: ${reason}`);

  // Replay it: a confirmation that says what will happen, then the action.
  await page.getByRole('link', { name: 'Replay…' }).click();
  await page.waitForURL(/\/event\/replay\?/);
  assert.match(await page.locator('main').innerText(), /back to pending with its attempts reset/);
  await page.fill('#reason', 'the account exists now');
  await page.getByRole('button', { name: 'Replay' }).click();
  await page.waitForURL(/done=replayed/);
  assert.match(await page.locator('[role=status]').innerText(), /Replayed/);
  check('replay asks for confirmation, then puts the event back to pending');

  // The worker takes it: reload until it is done.
  let status = '';
  for (let i = 0; i < 60 && status !== 'done'; i++) {
    await page.reload();
    status = await page.locator('h1 .status').innerText();
    if (status !== 'done') await page.waitForTimeout(500);
  }
  assert.equal(status, 'done', 'the replayed event becomes done');
  const history = await page.locator('section[aria-labelledby=history-h] tbody').innerText();
  assert.match(history, /replay/);
  assert.match(history, new RegExp(`console:${env('OPERATOR')}`));
  assert.match(history, /the account exists now/);
  check('the event becomes done, its history names the replay, who and why');

  // An action without its CSRF token, or with another's, or from another site: refused, nothing done.
  const hostileId = env('HOSTILE_ID');
  const csrf = await page.locator('header form input[name=csrf]').getAttribute('value');
  for (const [what, form, headers] of [
    ['without a CSRF token', { provider: 'stripe', id: hostileId }, {}],
    ['with a forged CSRF token', { provider: 'stripe', id: hostileId, csrf: 'x'.repeat(43) }, {}],
    ['from another site', { provider: 'stripe', id: hostileId, csrf }, { Origin: 'https://attacker.example' }],
  ]) {
    const r = await page.request.post(`${url}/event/replay`, { form, headers, maxRedirects: 0 });
    assert.equal(r.status(), 403, `a replay ${what} is refused`);
    assert.match(await r.text(), /nothing was done/);
    check(`a replay ${what} is refused (403, nothing was done)`);
  }
  await page.goto(eventUrl('stripe', hostileId));
  assert.equal(await page.locator('h1 .status').innerText(), 'failed', 'the hostile event was not replayed');
  noProblems(op, 'the operator');

  // Health at a glance: receive's counts arrive within its 10 s tally.
  let label = '';
  // The hostile payment and twelve others, each once; the hostile one again (a duplicate) and forged (rejected).
  for (let i = 0; i < 40 && !/^stripe: 13 received/.test(label); i++) {
    await page.goto(`${url}/health`);
    label = (await page.locator('svg.chart.received[aria-label^="stripe:"]').getAttribute('aria-label')) || '';
    if (!/^stripe: 13 received/.test(label)) await page.waitForTimeout(500);
  }
  assert.match(label, /^stripe: 13 received/, 'the health page counts the deliveries received');
  const charts = async (series) => page.locator(`svg.chart.${series}[aria-label^="stripe:"]`).getAttribute('aria-label');
  assert.match(await charts('duplicate'), /^stripe: 1 duplicate/);
  assert.match(await charts('rejected'), /^stripe: 1 rejected/);
  assert.match(await charts('failed'), /^stripe: 1 failed/);
  assert.ok(await page.locator('svg.chart.received[aria-label^="stripe:"] rect').count() >= 1, 'a bar is drawn');
  assert.match(await page.locator('main').innerText(), /Secrets in use/);
  await page.screenshot({ path: `${shots}/console-health.png`, fullPage: true });
  check('the health page charts received, duplicate, rejected and failed per minute');

  // ---- pause GitHub's issues from the Pauses page; a delivery waits, held; resume, and it is processed ----
  await page.getByRole('link', { name: 'Pauses' }).click();
  await page.waitForURL(/\/pauses$/);
  assert.match(await page.locator('main').innerText(), /Nothing is paused/);
  await page.fill('#provider', 'github');
  await page.fill('#type', 'issues.opened');
  await page.getByRole('button', { name: 'Pause…' }).click();
  await page.waitForURL(/\/pause\?/);
  assert.match(await page.locator('main').innerText(), /no event of github issues\.opened is processed/);
  await page.fill('#reason', 'triage bot misbehaving');
  await page.getByRole('button', { name: 'Pause' }).click();
  await page.waitForURL(/\/pauses\?paused=/);
  assert.match(await page.locator('[role=status]').innerText(), /github issues\.opened paused/);
  const body = JSON.stringify({ action: 'opened', issue: { number: 99, title: 'Paused in the browser test' } });
  const signature = 'sha256=' + createHmac('sha256', 'dev_github_secret').update(body).digest('hex');
  const delivered = await page.request.post(new URL('/webhooks/github', url).href, {
    data: body,
    headers: { 'Content-Type': 'application/json', 'X-GitHub-Event': 'issues', 'X-GitHub-Delivery': 'gh-paused-1',
      'X-Hub-Signature-256': signature },
  });
  assert.equal(delivered.status(), 200, 'a paused provider\'s delivery is still received');
  const pauseRow = page.locator('main table tbody tr').first();
  let held = '';
  for (let i = 0; i < 40 && held !== '1'; i++) {
    await page.reload();
    held = await pauseRow.locator('td.num').innerText();
    if (held !== '1') await page.waitForTimeout(250);
  }
  assert.equal(held, '1', 'the worker holds the delivery');
  assert.match(await pauseRow.innerText(), /triage bot misbehaving/);
  await page.screenshot({ path: `${shots}/console-pauses.png`, fullPage: true });
  await page.goto(eventUrl('github', 'gh-paused-1'));
  assert.equal(await page.locator('h1 .status').innerText(), 'pending');
  assert.match(await page.locator('#held').innerText(), /Held by a pause/);
  check('a pause from the Pauses page holds a new delivery: received, pending, held, no attempt');
  await page.goto(`${url}/pauses`);
  await pauseRow.getByRole('link', { name: 'Resume…' }).click();
  await page.waitForURL(/pause=no/);
  assert.match(await page.locator('main').innerText(), /The 1 events of github issues\.opened held now are released/);
  await page.getByRole('button', { name: 'Resume' }).click();
  await page.waitForURL(/\/pauses\?resumed=/);
  let resumedStatus = '';
  for (let i = 0; i < 40 && resumedStatus !== 'unhandled'; i++) {
    await page.goto(eventUrl('github', 'gh-paused-1'));
    resumedStatus = await page.locator('h1 .status').innerText();
    if (resumedStatus !== 'unhandled') await page.waitForTimeout(250);
  }
  assert.equal(resumedStatus, 'unhandled', 'resumed: the worker processes it (no stock handler takes issues)');
  await page.goto(`${url}/pauses`);
  assert.match(await page.locator('main').innerText(), /Nothing is paused/);
  noProblems(op, 'the pauses');
  check('resume from the Pauses page: the held delivery is processed, and nothing is paused');

  // ---- the deposit that failed opened an alert; acknowledge it ----
  await page.getByRole('link', { name: 'Alerts' }).click();
  await page.waitForURL(/\/alerts$/);
  const alertRow = page.locator('table.alerts tbody tr').first();
  assert.match(await alertRow.innerText(), /deposits failing/);
  assert.match(await alertRow.innerText(), /events of marqeta failed/);
  assert.equal(await alertRow.locator('.status').innerText(), 'open');
  await page.screenshot({ path: `${shots}/console-alerts.png`, fullPage: true });
  await alertRow.getByRole('link', { name: 'Acknowledge…' }).click();
  await page.waitForURL(/act=ack/);
  await page.fill('#reason', 'looking at the deposits');
  await page.getByRole('button', { name: 'Acknowledge' }).click();
  await page.waitForURL(/done=ack/);
  assert.match(await page.locator('[role=status]').innerText(), /Acknowledged/);
  assert.equal(await alertRow.locator('.status').innerText(), 'acknowledged');
  assert.equal(await alertRow.getByRole('link', { name: 'Acknowledge…' }).count(), 0, 'acknowledged once');
  noProblems(op, 'the alerts');
  check('the Alerts page shows the alert the failed deposit opened, and the operator acknowledges it');

  // ---- a hostile payload, JavaScript on: nothing in it runs ----
  const js = await context();
  const p2 = await js.newPage();
  await signIn(p2, env('OPERATOR'), env('OPERATOR_PASSWORD'));
  await p2.goto(`${url}/events?provider=stripe`);
  await p2.goto(eventUrl('stripe', hostileId));
  await p2.waitForLoadState('load');
  assert.equal(await p2.evaluate(() => window.__pwned), undefined, 'no script from the payload ran');
  const text = await p2.locator('main').innerText();
  assert.ok(text.includes('<script>window.__pwned=1</script>'), 'the id is shown as text');
  assert.ok(text.includes('<img src=x onerror=window.__pwned=2>'), 'the img is shown as text');
  assert.ok(text.includes('javascript:window.__pwned=3'), 'the javascript: link is shown as text');
  assert.equal(await p2.locator('main img').count(), 0, 'no img element came from the payload');
  assert.equal(await p2.locator('a[href^="javascript:"]').count(), 0, 'no javascript: link');
  // Every link on the page stays in the console.
  for (const href of await p2.locator('a').evaluateAll((as) => as.map((a) => a.getAttribute('href')))) {
    assert.ok(href.startsWith('/') || href.startsWith('#'), `a link leaves the console: ${href}`);
  }
  const csp = (await p2.request.get(eventUrl('stripe', hostileId))).headers()['content-security-policy'];
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'self';/, 'scripts from the console only');
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|\*/, 'no inline script, no eval, no other origin');
  noProblems(js, 'the hostile payload');
  check('a payload with <script>, <img onerror> and javascript: runs nothing, and shows as text');

  // ---- the Events page is live: a delivery made while it is open appears on it, under the CSP ----
  await p2.goto(`${url}/events`);
  await p2.waitForFunction(() => document.getElementById('live')?.dataset.state === 'live', null, { timeout: 10000 });
  await p2.evaluate(() => { window.__loaded = 'once'; });
  const stripe = async (id, amount) => {
    const body = JSON.stringify({ id, type: 'payment_intent.succeeded',
      data: { object: { id: `pi_${amount}`, amount_received: amount, currency: 'usd' } } });
    const t = Math.floor(Date.now() / 1000);
    const v1 = createHmac('sha256', 'whsec_dev_stripe_secret').update(`${t}.${body}`).digest('hex');
    const r = await p2.request.post(new URL('/webhooks/stripe', url).href,
      { data: body, headers: { 'Content-Type': 'application/json', 'Stripe-Signature': `t=${t},v1=${v1}` } });
    assert.equal(r.status(), 200, `the delivery of ${id} is accepted`);
  };
  const liveId = 'evt_live_<img src=x onerror=window.__pwned=5>';
  await stripe(liveId, 4200);
  await stripe('evt_live_2', 1999);
  const liveRow = p2.locator('table.events tbody tr', { has: p2.locator('td.id', { hasText: liveId }) });
  await liveRow.waitFor({ timeout: 15000 });
  await liveRow.locator('.status.done').waitFor({ timeout: 15000 });
  await p2.locator('table.events tbody tr', { hasText: 'evt_live_2' }).locator('.status.done').waitFor({ timeout: 15000 });
  assert.equal(await p2.evaluate(() => window.__loaded), 'once', 'the rows came without a reload');
  assert.equal(await p2.evaluate(() => window.__pwned), undefined, 'nothing in the live row ran');
  assert.equal(await p2.locator('main img').count(), 0, 'no img element came from the live row');
  assert.match(await liveRow.locator('td.id a').getAttribute('href'), /^\/console\/event\?/, 'the row links to its event');
  assert.equal(await p2.locator('table.events tbody tr').first().locator('td.id').innerText(), 'evt_live_2', 'newest first');
  await p2.screenshot({ path: `${shots}/console-events.png`, fullPage: true });
  noProblems(js, 'the live listing');
  check('the Events page shows new deliveries and their status changes live, as text, under the CSP');

  // ---- a viewer cannot act ----
  const viewer = await context();
  const p3 = await viewer.newPage();
  await signIn(p3, env('VIEWER'), env('VIEWER_PASSWORD'), { keyboard: true });
  check('the viewer signs in with the keyboard alone');
  await p3.goto(eventUrl('stripe', hostileId));
  assert.equal(await p3.getByRole('link', { name: 'Replay…' }).count(), 0, 'a viewer has no replay button');
  assert.equal(await p3.locator('h1 .status').innerText(), 'failed');
  const viewerCsrf = await p3.locator('header form input[name=csrf]').getAttribute('value');
  const confirm = await p3.request.get(`${url}/event/replay?${new URLSearchParams({ provider: 'stripe', id: hostileId })}`);
  assert.equal(confirm.status(), 403, 'a viewer gets no replay confirmation');
  const acted = await p3.request.post(`${url}/event/replay`, {
    form: { provider: 'stripe', id: hostileId, csrf: viewerCsrf }, maxRedirects: 0,
  });
  assert.equal(acted.status(), 403, 'a viewer\'s replay is refused, even with its own CSRF token');
  await p3.reload();
  assert.equal(await p3.locator('h1 .status').innerText(), 'failed', 'the viewer changed nothing');
  await p3.goto(`${url}/events?status=failed`);
  assert.equal(await p3.getByRole('link', { name: /Requeue/ }).count(), 0, 'a viewer has no requeue button');
  await p3.goto(`${url}/pauses`);
  assert.equal(await p3.getByRole('button', { name: 'Pause…' }).count(), 0, 'a viewer has no pause form');
  await p3.goto(`${url}/alerts`);
  assert.match(await p3.locator('main').innerText(), /deposits failing/);
  assert.equal(await p3.getByRole('link', { name: /Resolve/ }).count(), 0, 'a viewer has no alert action');
  noProblems(viewer, 'the viewer');
  check('a viewer sees no button, and its requests to act are refused (403)');

  // Signing out ends the session: the cookie's page needs signing in again.
  await p3.getByRole('button', { name: 'Sign out' }).click();
  await p3.waitForURL(/\/signin/);
  await p3.goto(`${url}/events`);
  assert.match(p3.url(), /\/signin/);
  check('sign-out ends the session');

  // ---- sessions: the operator is signed in twice (JavaScript off, and on); one ends the other ----
  await p2.getByRole('link', { name: new RegExp(env('OPERATOR')) }).click();
  await p2.waitForURL(/\/sessions/);
  const sessions = p2.locator('main table').first().locator('tbody tr');
  assert.equal(await sessions.count(), 2, 'two sessions of the operator');
  assert.equal(await p2.getByText('this one').count(), 1, 'this one is marked');
  assert.match(await p2.locator('main').innerText(), /sign_in_failed/, 'the wrong password is in its history');
  await p2.getByRole('button', { name: 'End every other session' }).click();
  await p2.waitForURL(/ended=1/);
  assert.equal(await sessions.count(), 1, 'one session left');
  await page.goto(`${url}/events`);
  assert.match(page.url(), /\/signin/, 'the other browser is signed out');
  check('the sessions page lists the operator\'s sessions and ends the other one');

  // ---- five wrong passwords lock the viewer out, here; the operator still signs in from here ----
  const guesser = await context({ javaScriptEnabled: false });
  const p4 = await guesser.newPage();
  await p4.goto(`${url}/signin`);
  for (let i = 0; i < 5; i++) {
    await p4.fill('#name', env('VIEWER'));
    await p4.fill('#password', `wrong guess ${i}`);
    await p4.click('button[type=submit]');
    assert.match(await p4.locator('[role=alert]').innerText(), /do not match/, `guess ${i + 1} refused`);
  }
  await p4.fill('#name', env('VIEWER'));
  await p4.fill('#password', env('VIEWER_PASSWORD'));
  await p4.click('button[type=submit]');
  assert.match(await p4.locator('main').innerText(), /Too many failed sign-ins: try again in 15 minutes/);
  check('the sixth try is refused, right password or not, and says how long to wait');
  const after = await context();
  const p5 = await after.newPage();
  await signIn(p5, env('OPERATOR'), env('OPERATOR_PASSWORD'));
  check('another user still signs in from the same address');
} finally {
  await browser.close();
}
console.log('all browser checks passed');

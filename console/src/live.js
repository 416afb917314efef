// The Events page, live: its newest page kept current from the console's
// stream (server-sent events, `data-live` on the table), every row built as
// text (textContent), never as HTML. Without this script, or when the stream
// stops, the page stays as it was sent.
'use strict';
(() => {
  const table = document.querySelector('table.events[data-live]');
  const note = document.getElementById('live');
  if (!table || !note || !window.EventSource) return;
  const body = table.tBodies[0];
  const statuses = new Set(['pending', 'done', 'failed', 'unhandled', 'ignored']);

  const cell = (text, className) => {
    const td = document.createElement('td');
    if (className) td.className = className;
    td.textContent = text;
    return td;
  };
  const row = (r) => {
    const tr = document.createElement('tr');
    const id = cell('', 'id');
    const link = document.createElement('a');
    if (typeof r.href === 'string' && r.href.startsWith('/')) link.setAttribute('href', r.href);
    link.textContent = r.event_id;
    id.append(link);
    const status = cell('');
    const badge = document.createElement('span');
    badge.className = statuses.has(r.status) ? `status ${r.status}` : 'status';
    badge.textContent = r.status;
    status.append(badge);
    tr.append(cell(r.received_at, 'time'), cell(r.provider), cell(r.event_type), id, status,
      cell(String(r.attempts), 'num'), cell(r.reason, 'reason'));
    return tr;
  };

  const source = new EventSource(table.dataset.live);
  source.addEventListener('open', () => {
    note.textContent = 'Live: new events and status changes appear here as they happen.';
    note.dataset.state = 'live';
  });
  source.addEventListener('error', () => {
    const stopped = source.readyState === EventSource.CLOSED;
    note.textContent = stopped ? 'Live updates stopped: reload the page to see newer events.' : 'Live updates reconnecting…';
    note.dataset.state = stopped ? 'stopped' : 'reconnecting';
  });
  source.addEventListener('page', (e) => {
    const rows = JSON.parse(e.data);
    const fresh = document.createDocumentFragment();
    for (const r of rows) fresh.append(row(r));
    if (rows.length === 0) {
      const empty = cell('No event matches.', 'empty');
      empty.colSpan = 7;
      const tr = document.createElement('tr');
      tr.append(empty);
      fresh.append(tr);
    }
    body.replaceChildren(fresh);
  });
})();

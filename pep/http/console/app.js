/* xsg console: a single page over the gateway's public HTTP API. Plain JavaScript, no library.
 *
 * Security: the bearer token lives in this closure only (never localStorage, sessionStorage or a
 * cookie; a reload signs out). Every call sends it in an Authorization header, which no other
 * site can make a browser send, so there is nothing for a cross-site request to borrow (no CSRF).
 * An EventSource cannot send headers: it carries a handle read token instead, minted with the
 * bearer token by POST /handles/<id>/read-token, valid for minutes and for GET of that one handle
 * only. Everything the server or a stream sends is shown with textContent, never as HTML.
 */
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const FINAL_EVENTS = ['revoked', 'released', 'ended', 'shutdown'];
  const KEEP_ROWS = 300;       // rows kept for the table and the chart
  const TABLE_ROWS = 40;       // rows shown in the table
  const TRAIL = 12;            // positions kept per point on the map
  const XACML_NS = 'urn:oasis:names:tc:xacml:3.0:core:schema:wd-17';

  const S = {
    token: null,      // the bearer token: page memory only
    me: null,         // GET /console/whoami
    streams: [],
    policy: null,     // {id, isNew} in the editor
    rule: null,       // {id} of the sharing rule in the rule form (id null: a new one)
    history: [],
    live: null,       // the live view of one handle
    handles: [],
  };

  // -- small DOM helpers (text only: nothing is ever parsed as HTML) ----------------------------

  function h(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined || kid === false) continue;
      e.append(kid instanceof Node ? kid : String(kid));
    }
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
  const enc = encodeURIComponent;
  let flashTimer = null;

  function flash(message, bad) {
    const f = $('flash');
    f.textContent = message;
    f.className = 'flash' + (bad ? ' error' : '');
    f.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { f.hidden = true; }, 8000);
  }

  function setResult(id, message, ok) {
    const p = $(id);
    p.textContent = message;
    p.className = 'result ' + (ok ? 'ok' : 'bad');
  }

  // Empty and neither ok nor bad: a result left from an earlier action must not read as this one's.
  function clearResult(id) {
    const p = $(id);
    p.textContent = '';
    p.className = 'result';
  }

  function badge(node, text, cls) {
    node.textContent = text;
    node.className = 'badge ' + (cls || text);
  }

  // -- the API ------------------------------------------------------------------------------------

  function xacmlDecision(text) {
    try {
      const doc = new DOMParser().parseFromString(text, 'application/xml');
      const d = doc.getElementsByTagNameNS(XACML_NS, 'Decision')[0];
      const m = doc.getElementsByTagNameNS(XACML_NS, 'StatusMessage')[0];
      if (d) return { decision: d.textContent.trim(), message: m ? m.textContent.trim() : '' };
    } catch (e) { /* not XML */ }
    try {
      const j = JSON.parse(text);
      const r = (j.Response && (Array.isArray(j.Response) ? j.Response[0] : j.Response)) || null;
      if (r && r.Decision) {
        return { decision: r.Decision, message: (r.Status && r.Status.StatusMessage) || '' };
      }
    } catch (e) { /* not JSON */ }
    return null;
  }

  // The error body is {error, status, ...details}; a denial is a XACML response.
  function describeError(r) {
    if (r.status === 0) return r.error;
    const j = r.json;
    if (j && typeof j.error === 'string') {
      const extra = Object.entries(j)
        .filter(([k, v]) => !['error', 'status'].includes(k) && v !== null && v !== undefined)
        .map(([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`);
      return `${r.status}: ${j.error}` + (extra.length ? ` (${extra.join('; ')})` : '');
    }
    const x = r.ctype.includes('xacml') ? xacmlDecision(r.text) : null;
    if (x) return `${r.status}: ${x.decision}` + (x.message ? ` (${x.message})` : '');
    return `${r.status}: ${r.text.slice(0, 300) || 'no answer body'}`;
  }

  async function api(method, path, opts = {}) {
    if (!S.token) return { status: 0, ok: false, error: 'not signed in', json: null, text: '', ctype: '' };
    const headers = { Authorization: 'Bearer ' + S.token, Accept: opts.accept || 'application/json' };
    if (opts.type) headers['Content-Type'] = opts.type;
    let res;
    try {
      res = await fetch(path, { method, headers, body: opts.body, cache: 'no-store',
                                credentials: 'omit', redirect: 'error' });
    } catch (err) {
      return { status: 0, ok: false, error: 'the gateway did not answer: ' + err.message,
               json: null, text: '', ctype: '' };
    }
    const text = await res.text();
    const ctype = res.headers.get('Content-Type') || '';
    let json = null;
    if (ctype.includes('json') && text) { try { json = JSON.parse(text); } catch (e) { json = null; } }
    const out = { status: res.status, ok: res.ok, headers: res.headers, text, json, ctype };
    if (!res.ok) out.error = describeError(out);
    if (res.status === 401 && opts.signOutOn401 !== false) {
      signOut('The gateway no longer accepts your token; sign in again.');
    }
    return out;
  }

  // -- signing in and out -------------------------------------------------------------------------

  const isManager = () => !!(S.me && (S.me.admin || S.me.may_register_streams));

  $('signin-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const input = $('signin-token');
    const token = input.value.trim();
    input.value = '';
    $('signin-error').hidden = true;
    if (!token) return;
    S.token = token;
    const r = await api('GET', '/console/whoami', { signOutOn401: false });
    if (!r.ok || !r.json) {
      S.token = null;
      $('signin-error').textContent = r.status === 401 ? 'This token is not valid here.' : r.error;
      $('signin-error').hidden = false;
      return;
    }
    S.me = r.json;
    $('whoami').textContent = `${S.me.subject}` + (S.me.admin ? ' (administrator)' : '') +
      (S.me.roles.length ? ` · ${S.me.roles.join(', ')}` : '');
    $('nav').hidden = false;
    $('signout').hidden = false;
    for (const e of document.querySelectorAll('[data-needs=owner]')) e.hidden = !isManager();
    if (!location.hash || location.hash === '#signin') location.hash = '#streams';
    else route();
  });

  function signOut(message) {
    closeLive();
    S.token = null; S.me = null; S.streams = []; S.policy = null; S.history = []; S.handles = [];
    S.rule = null;
    $('whoami').textContent = '';
    $('nav').hidden = true;
    $('signout').hidden = true;
    for (const id of ['streams-table', 'policies-table', 'handles-table', 'history-table']) {
      clear($(id).querySelector('tbody'));
    }
    $('editor-text').value = '';
    $('policy-editor').hidden = true;
    closeRuleEditor();
    $('policy-history').hidden = true;
    $('modal').hidden = true;
    resetTryResult();
    if (message) flash(message, true);
    route();
  }

  $('signout').addEventListener('click', () => signOut('Signed out.'));

  // -- pages --------------------------------------------------------------------------------------

  const PAGES = ['signin', 'streams', 'policies', 'try', 'handles'];
  const LOADERS = { streams: loadStreams, policies: loadPolicies, try: loadTry, handles: loadHandles };

  function route() {
    let page = (location.hash || '').replace(/^#/, '') || 'streams';
    if (!S.token) page = 'signin';
    else if (!PAGES.includes(page) || page === 'signin') page = 'streams';
    if (page === 'policies' && !isManager()) page = 'streams';
    for (const p of PAGES) $('page-' + p).hidden = p !== page;
    for (const a of document.querySelectorAll('#nav a')) {
      a.classList.toggle('active', a.dataset.page === page);
    }
    document.body.dataset.page = page;
    if (page === 'signin') $('signin-token').focus();
    if (LOADERS[page]) LOADERS[page]();
  }

  window.addEventListener('hashchange', route);

  // -- Streams ------------------------------------------------------------------------------------

  async function fetchStreams() {
    const r = await api('GET', '/streams');
    if (!r.ok) { flash(r.error, true); return false; }
    S.streams = r.json.streams || [];
    return true;
  }

  // A stream's visibility, with a switch for its owner and administrators: listed streams are
  // seen by everyone signed in, restricted ones by those a policy may permit (the gateway decides).
  function visibilityCell(s) {
    const vis = s.visibility || 'listed';
    const cell = h('td', { class: 'visibility' }, h('span', { class: 'badge ' + vis, text: vis }));
    if (S.me.admin || s.owner === S.me.subject) {
      const next = vis === 'listed' ? 'restricted' : 'listed';
      cell.append(' ', h('button', {
        type: 'button', class: 'secondary small', 'data-visibility-to': next,
        title: next === 'restricted' ? 'Show it only to those a policy may permit'
                                     : 'Show it to everyone signed in',
        text: next === 'restricted' ? 'Restrict' : 'List',
        onclick: () => setVisibility(s.name, next) }));
    }
    return cell;
  }

  async function setVisibility(name, visibility) {
    const r = await api('PATCH', `/streams/${enc(name)}`,
                        { type: 'application/json', body: JSON.stringify({ visibility }) });
    if (!r.ok) { flash(r.error, true); return; }
    flash(`Stream ${r.json.name} is now ${r.json.visibility}.`, false);
    loadStreams();
  }

  const mine = (s) => !!(S.me && (S.me.admin || s.owner === S.me.subject));
  const seconds = (v) => (v === null || v === undefined ? 'default' : `${v} s`);

  function settingsCell(s) {
    return h('td', { class: 'settings' },
      s.description ? h('div', { class: 'description', text: s.description }) : null,
      h('div', { class: 'hint', text: `lateness ${seconds(s.lateness)} · retention ${seconds(s.retention)}` }));
  }

  function actionsCell(s) {
    if (!mine(s)) return h('td', {});
    return h('td', { class: 'actions' },
      h('button', { type: 'button', class: 'secondary small', 'data-change': s.name, text: 'Change…',
                    onclick: () => openChange(s.name) }),
      h('button', { type: 'button', class: 'danger small', 'data-delete': s.name, text: 'Delete…',
                    onclick: () => deleteStream(s.name) }));
  }

  async function loadStreams() {
    if (!await fetchStreams()) return;
    const body = clear($('streams-table').querySelector('tbody'));
    for (const s of S.streams) {
      const options = Object.entries(s.source || {}).filter(([k]) => k !== 'kind')
        .map(([k, v]) => `${k}=${v}`).join(', ');
      body.append(h('tr', { 'data-stream': s.name, 'data-visibility': s.visibility || 'listed' },
        h('td', { text: s.name }), h('td', { text: s.owner }),
        h('td', { text: s.time_attribute || '—' }),
        h('td', { text: s.source.kind + (options ? ` (${options})` : '') }),
        h('td', { class: 'schema' }, s.schema.map((f) => h('span', {
          text: `${f.name}: ${f.type}` + (f.optional ? '?' : ''),
          title: f.optional ? 'added after registration: records may leave it out' : null }))),
        visibilityCell(s), settingsCell(s), actionsCell(s)));
    }
    if (!S.streams.length) body.append(h('tr', {}, h('td', { colspan: 8, class: 'hint', text: 'No streams yet.' })));
    const open = $('stream-change').dataset.stream;
    if (open && !S.streams.some((s) => s.name === open && mine(s))) closeChange();
    const select = clear($('append-stream'));
    for (const s of S.streams) {
      if ((S.me.admin || s.owner === S.me.subject) && s.source.kind === 'ingest') {
        select.append(h('option', { value: s.name, text: s.name }));
      }
    }
  }

  $('streams-refresh').addEventListener('click', loadStreams);

  // Change: description, lateness, retention, added attributes (PATCH /streams/<name>; only
  // what differs from the stream as it is is sent).
  function openChange(name) {
    const s = S.streams.find((x) => x.name === name);
    if (!s) return;
    const form = $('stream-change');
    form.dataset.stream = name;
    $('change-name').textContent = name;
    $('change-description').value = s.description || '';
    $('change-lateness').value = s.lateness === null || s.lateness === undefined ? '' : String(s.lateness);
    $('change-lateness').disabled = !s.time_attribute;
    $('change-retention').value = s.retention === null || s.retention === undefined ? '' : String(s.retention);
    $('change-attributes').value = '';
    $('change-attributes').disabled = s.source.kind !== 'ingest';
    clearResult('change-result');
    form.hidden = false;
    form.scrollIntoView({ block: 'nearest' });
  }

  function closeChange() {
    const form = $('stream-change');
    form.hidden = true;
    delete form.dataset.stream;
  }

  $('change-close').addEventListener('click', closeChange);

  function secondsField(id, current, name, body) {
    const text = $(id).value.trim();
    const value = text === '' ? null : Number(text);
    if (value !== null && !(Number.isFinite(value) && value >= 0)) {
      throw new Error(`${name}: a number of seconds, at least 0 (or empty for the default)`);
    }
    if (value !== (current === undefined ? null : current)) body[name] = value;
  }

  $('stream-change').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const name = $('stream-change').dataset.stream;
    const s = S.streams.find((x) => x.name === name);
    if (!s) return;
    const body = {};
    try {
      const description = $('change-description').value.trim();
      if (description !== (s.description || '')) body.description = description;
      if (s.time_attribute) secondsField('change-lateness', s.lateness, 'lateness', body);
      secondsField('change-retention', s.retention, 'retention', body);
      const added = [];
      const lines = $('change-attributes').value.split('\n');
      for (let i = 0; i < lines.length; i++) {
        const line = lines[i].trim();
        if (!line) continue;
        const parts = line.split(/[\s:]+/);
        if (parts.length !== 2) throw new Error(`attribute line ${i + 1}: expected "name type", got "${line}"`);
        added.push({ name: parts[0], type: parts[1] });
      }
      if (added.length) body.add_attributes = added;
    } catch (err) {
      setResult('change-result', err.message, false);
      return;
    }
    if (!Object.keys(body).length) { setResult('change-result', 'Nothing to change.', false); return; }
    const r = await api('PATCH', `/streams/${enc(name)}`, { type: 'application/json', body: JSON.stringify(body) });
    if (!r.ok) { setResult('change-result', r.error, false); return; }
    const j = r.json;
    let text = `Changed stream ${j.name}: ${Object.keys(body).join(', ')}.`;
    if (j.added && j.added.length) {
      text += ` Added ${j.added.join(', ')}; ${j.revoked} handle${j.revoked === 1 ? '' : 's'} revoked` +
        (j.revoked ? ' (their grant covered every attribute).' : '.');
    }
    for (const w of j.warnings || []) text += ` Warning: ${w}`;
    await loadStreams();
    openChange(name);
    setResult('change-result', text, true);
  });

  // Delete: first what depends on the stream (live handles, events, policies), then a
  // confirmation; the options (remove policies, keep files) are sent as query parameters.
  function renderDependents(box, d) {
    clear(box);
    const n = d.live_handles;
    box.append(h('p', { id: 'modal-count', 'data-count': n,
      text: n === 0 ? 'No live handle reads this stream.'
        : `${n} live handle${n === 1 ? '' : 's'} on this stream` +
          (d.joins ? ` (${d.joins} join${d.joins === 1 ? '' : 's'})` : '') +
          ` will be revoked: ${n === 1 ? 'its reader gets' : 'their readers get'} a revoked event and nothing after it.` }));
    if (d.events.length) box.append(h('p', { text: `Its events go with it: ${d.events.join(', ')}.` }));
    if (d.policies.length) {
      box.append(h('p', { text: 'Policies that name it:' }));
      box.append(h('ul', { id: 'delete-policies' }, d.policies.map((p) => h('li', {
        'data-policy': p.id, 'data-action': p.action, text: `${p.id}: ${p.action} (${p.reason})` }))));
    } else {
      box.append(h('p', { id: 'delete-policies-none', text: 'No policy you manage names it.' }));
    }
    if (d.other_policies) {
      box.append(h('p', { class: 'hint', text: `${d.other_policies} other polic${d.other_policies === 1 ? 'y' : 'ies'} (that you do not manage) name${d.other_policies === 1 ? 's' : ''} it: kept.` }));
    }
  }

  async function deleteStream(name) {
    const dependents = async (remove) => api('GET', `/streams/${enc(name)}/dependents?remove_policies=${remove}`);
    const r = await dependents(false);
    if (!r.ok) { flash(r.error, true); return; }
    const body = clear($('modal-body'));
    const info = h('div', { id: 'delete-dependents' });
    renderDependents(info, r.json);
    const remove = h('input', { type: 'checkbox', id: 'delete-remove-policies' });
    remove.addEventListener('change', async () => {
      const again = await dependents(remove.checked);
      if (again.ok) renderDependents(info, again.json);
    });
    const keep = h('input', { type: 'number', id: 'delete-keep-data', min: '0', step: 'any', value: '0' });
    body.append(info,
      h('label', { class: 'check' }, remove, ' Remove the policies confined to this stream with it'),
      h('label', { for: 'delete-keep-data', text: 'Keep its files (ingested records, checkpoint, archive) for this many seconds (0: remove them now)' }),
      keep,
      h('p', { class: 'hint', text: 'The name stays yours: only you (or an administrator) may register it again.' }));
    const ok = await confirmModal(`Delete stream ${name}?`);
    if (!ok) return;
    const keepSeconds = keep.value.trim() === '' ? '0' : keep.value.trim();
    const d = await api('DELETE', `/streams/${enc(name)}?remove_policies=${remove.checked}&keep_data=${enc(keepSeconds)}`);
    if (!d.ok) { flash(d.error, true); return; }
    const j = d.json;
    const removed = j.policies.filter((p) => p.action === 'removed').map((p) => p.id);
    const kept = j.policies.filter((p) => p.action === 'kept').map((p) => p.id);
    flash(`Deleted stream ${j.stream}: ${j.handles_revoked} handle${j.handles_revoked === 1 ? '' : 's'} revoked` +
      (removed.length ? `; policies removed: ${removed.join(', ')}` : '') +
      (kept.length ? `; policies kept: ${kept.join(', ')}` : '') +
      (j.data === 'removed' ? '; its files were removed.' : `; its files are kept until ${j.data.kept_until}.`), false);
    if ($('stream-change').dataset.stream === name) closeChange();
    loadStreams();
  }

  $('stream-register').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const name = $('reg-name').value.trim();
    const [kind, builtin] = $('reg-source').value.split(':');
    const body = { name, source: { kind }, visibility: $('reg-visibility').value };
    if (kind === 'generator') {
      body.source.schema = builtin;
      body.source.rate = 5;
    } else {
      const schema = [];
      const lines = $('reg-schema').value.split('\n');
      for (let i = 0; i < lines.length; i++) {
        const line = lines[i].trim();
        if (!line) continue;
        const parts = line.split(/[\s:]+/);
        if (parts.length !== 2) {
          setResult('reg-result', `schema line ${i + 1}: expected "name type", got "${line}"`, false);
          return;
        }
        schema.push({ name: parts[0], type: parts[1] });
      }
      body.schema = schema;
      const time = $('reg-time').value.trim();
      if (time) body.time_attribute = time;
    }
    const r = await api('POST', '/streams', { type: 'application/json', body: JSON.stringify(body) });
    if (!r.ok) { setResult('reg-result', r.error, false); return; }
    setResult('reg-result', `Registered stream ${r.json.name} (owner ${r.json.owner}, ${r.json.visibility}).`, true);
    loadStreams();
  });

  $('stream-append').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const name = $('append-stream').value;
    const file = $('append-file').files[0];
    if (!name) { setResult('append-result', 'Choose one of your ingest streams.', false); return; }
    if (!file) { setResult('append-result', 'Choose a JSON lines file.', false); return; }
    const r = await api('POST', `/streams/${enc(name)}/records`,
                        { type: 'application/x-ndjson', body: file });
    if (!r.ok) { setResult('append-result', r.error, false); return; }
    setResult('append-result', `Appended ${r.json.appended} record(s) to ${r.json.stream}.`, true);
  });

  // -- Policies -----------------------------------------------------------------------------------

  const TEMPLATE = `<?xml version="1.0" encoding="UTF-8"?>
<Policy xmlns="urn:oasis:names:tc:xacml:3.0:core:schema:wd-17"
        PolicyId="urn:example:my-policy" Version="1.0"
        RuleCombiningAlgId="urn:oasis:names:tc:xacml:1.0:rule-combining-algorithm:first-applicable">
  <Target>
    <AnyOf>
      <AllOf>
        <Match MatchId="urn:oasis:names:tc:xacml:1.0:function:string-equal">
          <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">my-stream</AttributeValue>
          <AttributeDesignator Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource"
                               AttributeId="urn:oasis:names:tc:xacml:1.0:resource:resource-id"
                               DataType="http://www.w3.org/2001/XMLSchema#string" MustBePresent="false"/>
        </Match>
      </AllOf>
    </AnyOf>
  </Target>
  <Rule RuleId="urn:example:my-policy:permit" Effect="Permit"/>
</Policy>
`;

  async function loadPolicies() {
    const r = await api('GET', '/policies');
    if (!r.ok) { flash(r.error, true); return; }
    const body = clear($('policies-table').querySelector('tbody'));
    for (const p of r.json) {
      const open = h('button', { type: 'button', class: 'secondary small', text: 'XACML',
                                 'data-action': 'xacml', onclick: () => openPolicy(p.id) });
      const edit = p.form === 'rule' ? h('button', { type: 'button', class: 'small', text: 'Edit rule',
                                                     'data-action': 'rule', onclick: () => openRule(p.id) }) : null;
      const selected = (S.policy && S.policy.id === p.id) || (S.rule && S.rule.id === p.id);
      body.append(h('tr', { 'data-policy': p.id, 'data-form': p.form || '', class: selected ? 'selected' : null },
        h('td', { text: p.id }), h('td', { class: 'summary', text: p.summary || '' }),
        h('td', { text: p.version }), h('td', { text: p.store_version }),
        h('td', { text: p.owner || '' }), h('td', { text: p.created_at || '' }), h('td', {}, open, edit)));
    }
    $('policies-empty').hidden = r.json.length > 0;
  }

  $('policies-refresh').addEventListener('click', loadPolicies);
  $('policy-new').addEventListener('click', () => { closeRuleEditor(); showEditor(null, TEMPLATE); });

  function showEditor(id, text) {
    closeRuleEditor();
    S.policy = { id, isNew: id === null };
    $('policy-editor').hidden = false;
    $('policy-history').hidden = true;
    $('editor-title').textContent = id === null ? 'New policy' : id;
    $('editor-history').hidden = id === null;
    $('editor-delete').hidden = id === null;
    $('editor-save').textContent = id === null ? 'Upload' : 'Save a new version';
    $('editor-text').value = text;
    clearResult('editor-result');
    markError(null);
    renderGutter();
    $('editor-text').scrollTop = 0;
    for (const tr of document.querySelectorAll('#policies-table tbody tr')) {
      tr.classList.toggle('selected', tr.dataset.policy === id);
    }
  }

  async function openPolicy(id) {
    const r = await api('GET', `/policies/${enc(id)}`, { accept: 'application/xacml+xml' });
    if (!r.ok) { flash(r.error, true); return; }
    showEditor(id, r.text);
  }

  let errorLine = null;

  function renderGutter() {
    const n = $('editor-text').value.split('\n').length;
    const gutter = clear($('editor-gutter'));
    const lines = [];
    for (let i = 1; i <= n; i++) {
      if (i === errorLine) {
        if (lines.length) gutter.append(lines.join('\n') + '\n');
        lines.length = 0;
        gutter.append(h('span', { class: 'err', text: String(i) }));
      } else {
        lines.push(String(i));
      }
    }
    if (lines.length) gutter.append(lines.join('\n'));
    gutter.scrollTop = $('editor-text').scrollTop;
  }

  function markError(error) {
    const box = $('editor-error');
    if (!error) { box.hidden = true; errorLine = null; renderGutter(); return; }
    errorLine = error.line || null;
    const where = error.line ? `Line ${error.line}` + (error.column ? `, column ${error.column}` : '') : '';
    box.textContent = (where ? where + ': ' : '') + error.message;
    box.dataset.line = error.line || '';
    box.dataset.column = error.column || '';
    box.hidden = false;
    renderGutter();
    if (error.line) {
      const ta = $('editor-text');
      const lines = ta.value.split('\n');
      let start = 0;
      for (let i = 0; i < error.line - 1 && i < lines.length; i++) start += lines[i].length + 1;
      const lineText = lines[error.line - 1] || '';
      const col = Math.min(Math.max((error.column || 1) - 1, 0), lineText.length);
      ta.focus();
      ta.setSelectionRange(start + col, start + lineText.length);
      ta.scrollTop = Math.max(0, (error.line - 5) * 18);
      $('editor-gutter').scrollTop = ta.scrollTop;
    }
  }

  function loadError(r) {
    const j = r.json || {};
    const message = typeof j.error === 'string' ? j.error : r.error;
    let line = Number.isInteger(j.line) ? j.line : null;
    let column = null;
    // lxml's messages end with "line L, column C"; take the column when the line agrees
    const m = [...message.matchAll(/line (\d+), column (\d+)/g)].pop();
    if (m && (line === null || Number(m[1]) === line)) { line = Number(m[1]); column = Number(m[2]); }
    const parts = [message];
    if (j.element) parts.push(`element ${j.element}`);
    return { line, column, message: `${parts.join('; ')} (HTTP ${r.status})` };
  }

  $('editor-text').addEventListener('input', renderGutter);
  $('editor-text').addEventListener('scroll', () => { $('editor-gutter').scrollTop = $('editor-text').scrollTop; });
  $('editor-close').addEventListener('click', () => {
    $('policy-editor').hidden = true; $('policy-history').hidden = true; S.policy = null;
  });
  $('editor-file').addEventListener('change', async () => {
    const f = $('editor-file').files[0];
    if (f) { $('editor-text').value = await f.text(); markError(null); }
  });

  $('editor-save').addEventListener('click', async () => {
    const text = $('editor-text').value;
    const p = S.policy;
    const write = (query) => p.isNew
      ? api('POST', '/policies' + query, { type: 'application/xacml+xml', body: text })
      : api('PUT', `/policies/${enc(p.id)}${query}`, { type: 'application/xacml+xml', body: text });
    // first what it would do to the live handles; a confirmation when it would revoke any
    const dry = await write('?dry_run=true');
    if (!dry.ok) {
      clearResult('editor-result');
      markError(loadError(dry));
      return;
    }
    markError(null);
    const report = dry.json.what_if;
    if (report && (report.revoked || report.changed)) {
      const body = clear($('modal-body'));
      renderWhatIf(report, body);
      if (!await confirmModal(`Save ${dry.json.id}?`)) return;
    }
    const r = await write('');
    if (!r.ok) {
      clearResult('editor-result');
      markError(loadError(r));
      return;
    }
    S.policy = { id: r.json.id, isNew: false };
    $('editor-title').textContent = r.json.id;
    $('editor-history').hidden = false;
    $('editor-delete').hidden = false;
    $('editor-save').textContent = 'Save a new version';
    setResult('editor-result', `Saved ${r.json.id}: version ${r.json.version}, store version ${r.json.store_version}.`, true);
    await loadPolicies();
    if (!$('policy-history').hidden) showHistory();
  });

  async function showHistory() {
    const id = S.policy && S.policy.id;
    if (!id) return;
    const r = await api('GET', `/policies/${enc(id)}?history=true`);
    if (!r.ok) { flash(r.error, true); return; }
    S.history = r.json;
    const body = clear($('history-table').querySelector('tbody'));
    const n = S.history.length;
    S.history.forEach((v, i) => {
      body.append(h('tr', { 'data-store-version': v.store_version },
        h('td', {}, h('input', { type: 'radio', name: 'diff-a', value: v.store_version, checked: i === n - 2 || (n === 1) })),
        h('td', {}, h('input', { type: 'radio', name: 'diff-b', value: v.store_version, checked: i === n - 1 })),
        h('td', { text: v.store_version }), h('td', { text: v.version }), h('td', { text: v.owner || '' }),
        h('td', { text: v.created_at || '' }), h('td', { text: v.deleted ? 'deletion' : 'version' })));
    });
    $('diff').hidden = true;
    $('policy-history').hidden = false;
  }

  $('editor-history').addEventListener('click', showHistory);

  async function versionText(id, storeVersion) {
    const r = await api('GET', `/policies/${enc(id)}?store_version=${enc(storeVersion)}`,
                        { accept: 'application/xacml+xml' });
    if (r.status === 410) return '';  // a deletion: nothing
    if (!r.ok) throw new Error(r.error);
    return r.text;
  }

  $('history-diff').addEventListener('click', async () => {
    const a = document.querySelector('input[name=diff-a]:checked');
    const b = document.querySelector('input[name=diff-b]:checked');
    if (!a || !b) { flash('Pick two versions, A and B.', true); return; }
    let ta, tb;
    try {
      [ta, tb] = await Promise.all([versionText(S.policy.id, a.value), versionText(S.policy.id, b.value)]);
    } catch (err) { flash(err.message, true); return; }
    renderDiff(ta, tb, `store version ${a.value}`, `store version ${b.value}`);
  });

  // A line diff (longest common subsequence) shown as a unified diff with 3 lines of context.
  function lineDiff(a, b) {
    const n = a.length, m = b.length;
    if (n * m > 25e6) return null;
    const w = m + 1;
    const dp = new Uint32Array((n + 1) * w);
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        dp[i * w + j] = a[i] === b[j] ? dp[(i + 1) * w + j + 1] + 1
          : Math.max(dp[(i + 1) * w + j], dp[i * w + j + 1]);
      }
    }
    const ops = [];
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { ops.push([' ', a[i], i, j]); i++; j++; }
      else if (dp[(i + 1) * w + j] >= dp[i * w + j + 1]) { ops.push(['-', a[i], i, j]); i++; }
      else { ops.push(['+', b[j], i, j]); j++; }
    }
    while (i < n) { ops.push(['-', a[i], i, j]); i++; }
    while (j < m) { ops.push(['+', b[j], i, j]); j++; }
    return ops;
  }

  function renderDiff(textA, textB, nameA, nameB) {
    const out = clear($('diff'));
    out.hidden = false;
    const a = textA ? textA.replace(/\n$/, '').split('\n') : [];
    const b = textB ? textB.replace(/\n$/, '').split('\n') : [];
    const ops = lineDiff(a, b);
    out.append(h('span', { class: 'hunk', text: `--- ${nameA}\n` }), h('span', { class: 'hunk', text: `+++ ${nameB}` }));
    if (ops === null) { out.append(h('span', { text: 'too large to compare here' })); return; }
    const changed = ops.map((o) => o[0] !== ' ');
    if (!changed.some(Boolean)) { out.append(h('span', { text: '(identical)' })); out.dataset.changes = '0'; return; }
    const keep = ops.map((_, k) => {
      for (let d = -3; d <= 3; d++) if (changed[k + d]) return true;
      return false;
    });
    let k = 0;
    let changes = 0;
    while (k < ops.length) {
      if (!keep[k]) { k++; continue; }
      let end = k;
      while (end < ops.length && keep[end]) end++;
      const first = ops[k];
      out.append(h('span', { class: 'hunk', text: `@@ -${first[2] + 1} +${first[3] + 1} @@` }));
      for (let x = k; x < end; x++) {
        const [op, line] = ops[x];
        if (op !== ' ') changes++;
        out.append(h('span', { class: op === '+' ? 'add' : op === '-' ? 'del' : 'ctx', text: `${op} ${line}` }));
      }
      k = end;
    }
    out.dataset.changes = String(changes);
  }

  // Delete: first how many live handles depend on the policy, then a confirmation.
  $('editor-delete').addEventListener('click', async () => {
    const id = S.policy && S.policy.id;
    if (!id) return;
    const r = await api('GET', `/policies/${enc(id)}/handles`);
    if (!r.ok) { flash(r.error, true); return; }
    const n = r.json.live_handles;
    const body = clear($('modal-body'));
    body.append(h('p', { id: 'modal-count', 'data-count': n,
      text: n === 0 ? 'No live handle depends on this policy.'
        : `${n} live handle${n === 1 ? '' : 's'} depend${n === 1 ? 's' : ''} on this policy. ` +
          `Deleting it re-decides ${n === 1 ? 'it' : 'them'} at once: any it alone permitted ${n === 1 ? 'is' : 'are'} revoked, ` +
          `and ${n === 1 ? 'its reader gets' : 'their readers get'} a revoked event.` }));
    if (n > 0) {
      body.append(h('ul', {}, Object.entries(r.json.streams).map(([s, c]) => h('li', { text: `stream ${s}: ${c} handle${c === 1 ? '' : 's'}` }))));
      body.append(h('p', { class: 'hint', text: 'Held by: ' + r.json.subjects.join(', ') }));
      const dry = await api('DELETE', `/policies/${enc(id)}?dry_run=true`);
      if (dry.ok && dry.json.what_if) renderWhatIf(dry.json.what_if, body);
    }
    const ok = await confirmModal(`Delete policy ${id}?`);
    if (!ok) return;
    const d = await api('DELETE', `/policies/${enc(id)}`);
    if (!d.ok) { flash(d.error, true); return; }
    flash(`Deleted ${id}` + (n ? `; ${n} dependent handle(s) re-decided.` : '.'));
    $('policy-editor').hidden = true;
    $('policy-history').hidden = true;
    S.policy = null;
    loadPolicies();
  });

  function confirmModal(title) {
    return new Promise((resolve) => {
      $('modal-title').textContent = title;
      $('modal').hidden = false;
      const done = (value) => {
        $('modal').hidden = true;
        $('modal-confirm').onclick = null;
        $('modal-cancel').onclick = null;
        resolve(value);
      };
      $('modal-confirm').onclick = () => done(true);
      $('modal-cancel').onclick = () => done(false);
      $('modal-cancel').focus();
    });
  }


  // What a policy change would do to the live handles (a dry run's `what_if`), into `box`.
  function renderWhatIf(report, box) {
    const n = report.handles;
    box.append(h('p', { id: 'what-if-count', 'data-handles': n, 'data-revoked': report.revoked,
                        'data-changed': report.changed, 'data-kept': report.kept,
      text: n === 0 ? 'No live handle of your streams would be affected.'
        : `${n} live handle${n === 1 ? '' : 's'} would be decided again: ${report.revoked} revoked, ` +
          `${report.changed} with changed obligations (revoked; the consumer asks again), ${report.kept} kept.` }));
    if (!report.consumers.length) return;
    box.append(h('table', { class: 'grid small what-if', id: 'what-if-table' },
      h('thead', {}, h('tr', {}, ['Outcome', 'Consumer', 'Streams', 'Handles', 'Why'].map((t) => h('th', { text: t })))),
      h('tbody', {}, report.consumers.map((c) => h('tr', { 'data-subject': c.subject, 'data-outcome': c.outcome },
        h('td', { class: c.outcome, text: c.outcome }), h('td', { text: c.subject }),
        h('td', { text: c.streams.join(', ') }), h('td', { text: String(c.handles) }),
        h('td', { text: c.reason || '' }))))));
  }

  // -- Sharing rules: a form instead of XML -------------------------------------------------------

  const RULE_TYPE = 'application/vnd.xsg.rule+json';
  const FUNCTIONS = ['avg', 'max', 'min', 'sum', 'count', 'firstval', 'lastval'];
  const NUMERIC_ONLY = ['avg', 'sum'];
  let previewTimer = null;
  let previewSeq = 0;
  let lastXacml = '';

  function managedStreams() {
    return S.streams.filter((s) => S.me.admin || s.owner === S.me.subject);
  }

  function closeRuleEditor() {
    S.rule = null;
    $('rule-editor').hidden = true;
    clearTimeout(previewTimer);
  }

  async function openRule(id) {
    const r = await api('GET', `/policies/${enc(id)}`, { accept: RULE_TYPE });
    if (!r.ok || !r.json) { flash(r.error || 'not a sharing rule', true); return; }
    await openRuleEditor(r.json, id);
  }

  async function openRuleEditor(rule, id) {
    if (!await fetchStreams()) return;
    $('policy-editor').hidden = true;
    $('policy-history').hidden = true;
    S.policy = null;
    S.rule = { id: id || null };
    const streams = managedStreams();
    const select = clear($('rule-stream'));
    for (const s of streams) select.append(h('option', { value: s.name, text: s.name }));
    if (rule && rule.stream && !streams.some((s) => s.name === rule.stream)) {
      select.append(h('option', { value: rule.stream, text: rule.stream }));
    }
    if (rule) select.value = rule.stream;
    $('rule-title').textContent = id ? `Sharing rule ${id}` : 'New sharing rule';
    $('rule-id').value = id || (rule && rule.id) || '';
    $('rule-id').readOnly = !!id;
    $('rule-description').value = (rule && rule.description) || '';
    const who = rule ? rule.who : { subjects: [], roles: [], attributes: {} };
    const anyone = who === 'anyone';
    $('rule-anyone').checked = anyone;
    $('rule-subjects').value = anyone ? '' : (who.subjects || []).join(', ');
    $('rule-roles').value = anyone ? '' : (who.roles || []).join(', ');
    $('rule-who-attrs').value = anyone ? '' : Object.entries(who.attributes || {})
      .flatMap(([k, v]) => (Array.isArray(v) ? v : [v]).map((x) => `${k}=${x}`)).join('\n');
    const actions = rule ? rule.actions : ['read', 'subscribe'];
    $('rule-any-action').checked = actions === 'any';
    for (const box of document.querySelectorAll('input[name=rule-action]')) {
      box.checked = actions !== 'any' && actions.includes(box.value);
    }
    $('rule-filter').value = (rule && rule.filter) || '';
    $('rule-masks').value = Object.entries((rule && rule.mask) || {}).map(([a, m]) => `${a}:${m}`).join('; ');
    const w = rule && rule.window;
    $('rule-window-type').value = w ? w.type : '';
    $('rule-window-size').value = w ? w.size : 5;
    $('rule-window-step').value = w ? w.step : 5;
    $('rule-window-min').value = w && w.min_count ? w.min_count : '';
    const valid = (rule && rule.valid) || {};
    $('rule-valid-from').value = valid.from ? valid.from.replace(/Z$/, '') : '';
    $('rule-valid-until').value = valid.until ? valid.until.replace(/Z$/, '') : '';
    $('rule-grant-option').checked = !!(rule && rule.grant_option);
    $('rule-sample-subject').value = '';
    $('rule-sample-roles').value = '';
    clearResult('rule-result');
    ruleError(null);
    renderRuleAttributes(rule);
    await renderRuleEvents(rule ? rule.events : []);
    $('rule-editor').hidden = false;
    for (const tr of document.querySelectorAll('#policies-table tbody tr')) {
      tr.classList.toggle('selected', tr.dataset.policy === id);
    }
    schedulePreview(0);
  }

  function ruleStream() { return S.streams.find((s) => s.name === $('rule-stream').value); }

  // One row per attribute of the stream: shown, aggregates, group-by key, filterable before the window.
  function renderRuleAttributes(rule) {
    const table = $('rule-attrs-table');
    const head = clear(table.querySelector('thead'));
    head.append(h('tr', {}, h('th', { text: 'attribute' }), h('th', { text: 'shown' }),
      FUNCTIONS.map((f) => h('th', { text: f.replace(/val$/, ''), title: `${f} per window` })),
      h('th', { text: 'key', title: 'group-by key: aggregates per value of it' }),
      h('th', { text: 'pre', title: "the consumer's own filter may use it before the window" })));
    const body = clear(table.querySelector('tbody'));
    const s = ruleStream();
    if (!s) return;
    const shown = new Set((rule && rule.attributes) || []);
    const w = rule && rule.window;
    const aggs = new Set(w ? w.aggregates.map((a) => a.replace(/\s+/g, '')) : []);
    const keys = new Set(w ? w.group_by : []);
    const pre = new Set(w ? w.filterable : []);
    const box = (kind, attr, fn, checked, disabled) => h('input', {
      type: 'checkbox', 'data-kind': kind, 'data-attr': attr, 'data-fn': fn || null,
      checked: checked || null, disabled: disabled || null, 'aria-label': `${attr} ${fn || kind}`,
      onchange: () => schedulePreview() });
    for (const f of s.schema) {
      const numeric = ['double', 'long'].includes(f.type);
      body.append(h('tr', { 'data-attr': f.name },
        h('td', { text: `${f.name} (${f.type})` }),
        h('td', {}, box('show', f.name, null, shown.has(f.name))),
        FUNCTIONS.map((fn) => h('td', {}, box('agg', f.name, fn, aggs.has(`${f.name}:${fn}`),
          NUMERIC_ONLY.includes(fn) && !numeric))),
        h('td', {}, box('key', f.name, null, keys.has(f.name))),
        h('td', {}, box('pre', f.name, null, pre.has(f.name)))));
    }
    windowColumns();
  }

  function windowColumns() {
    const windowed = !!$('rule-window-type').value;
    for (const input of document.querySelectorAll('#rule-attrs-table input[data-kind=agg], #rule-attrs-table input[data-kind=key], #rule-attrs-table input[data-kind=pre]')) {
      const fnAllowed = !(NUMERIC_ONLY.includes(input.dataset.fn) &&
        !['double', 'long'].includes((ruleStream().schema.find((f) => f.name === input.dataset.attr) || {}).type));
      input.disabled = !windowed || !fnAllowed;
    }
    for (const id of ['rule-window-size', 'rule-window-step', 'rule-window-min']) $(id).disabled = !windowed;
  }

  async function renderRuleEvents(selected) {
    const box = $('rule-events');
    for (const e of [...box.querySelectorAll('label, p')]) e.remove();
    const s = ruleStream();
    const names = [];
    if (s) {
      const r = await api('GET', `/streams/${enc(s.name)}/events`);
      if (r.ok && r.json) for (const e of r.json.events || []) names.push(e.name);
    }
    for (const name of selected || []) if (!names.includes(name)) names.push(name);
    if (!names.length) box.append(h('p', { class: 'hint', text: 'This stream has no events.' }));
    for (const name of names) {
      box.append(h('label', { class: 'check' }, h('input', { type: 'checkbox', value: name,
        checked: (selected || []).includes(name) || null, onchange: () => schedulePreview() }), ` ${name}`));
    }
  }

  function typedValue(text) {
    const t = text.trim();
    if (t === 'true' || t === 'false') return t === 'true';
    if (/^-?\d+$/.test(t) && Number.isSafeInteger(Number(t))) return Number(t);
    if (/^-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$/.test(t)) return Number(t);
    return t;
  }

  function ruleFromForm() {
    const rule = { stream: $('rule-stream').value };
    const id = $('rule-id').value.trim();
    if (id) rule.id = id;
    const description = $('rule-description').value.trim();
    if (description) rule.description = description;
    if ($('rule-anyone').checked) {
      rule.who = 'anyone';
    } else {
      const attributes = {};
      for (const line of $('rule-who-attrs').value.split('\n')) {
        if (!line.trim()) continue;
        const at = line.indexOf('=');
        const key = (at < 0 ? line : line.slice(0, at)).trim();
        const value = at < 0 ? '' : typedValue(line.slice(at + 1));
        (attributes[key] = attributes[key] || []).push(value);
      }
      rule.who = { subjects: list($('rule-subjects').value), roles: list($('rule-roles').value),
                   attributes: Object.fromEntries(Object.entries(attributes).map(([k, v]) => [k, v.length === 1 ? v[0] : v])) };
    }
    rule.actions = $('rule-any-action').checked ? 'any'
      : [...document.querySelectorAll('input[name=rule-action]:checked')].map((i) => i.value);
    const filter = $('rule-filter').value.trim();
    if (filter) rule.filter = filter;
    // "speed:round:5; lat,lon:grid:0.1": the attributes before the first colon, the mask after
    const masks = $('rule-masks').value.split(';').map((x) => x.trim()).filter(Boolean);
    if (masks.length) {
      rule.mask = Object.fromEntries(masks.map((m) => {
        const at = m.indexOf(':');
        return at < 0 ? [m, ''] : [m.slice(0, at).trim(), m.slice(at + 1).trim()];
      }));
    }
    const ticked = (kind) => [...document.querySelectorAll(`#rule-attrs-table input[data-kind=${kind}]:checked`)];
    rule.attributes = ticked('show').map((i) => i.dataset.attr);
    const type = $('rule-window-type').value;
    if (type) {
      const number = (id) => ($(id).value === '' ? undefined : Number($(id).value));
      rule.window = { type, size: number('rule-window-size'), step: number('rule-window-step'),
                      aggregates: ticked('agg').map((i) => `${i.dataset.attr}:${i.dataset.fn}`),
                      group_by: ticked('key').map((i) => i.dataset.attr),
                      filterable: ticked('pre').map((i) => i.dataset.attr) };
      const min = number('rule-window-min');
      if (min !== undefined) rule.window.min_count = min;
    }
    const from = $('rule-valid-from').value, until = $('rule-valid-until').value;
    if (from || until) {
      rule.valid = {};
      if (from) rule.valid.from = (from.length === 16 ? from + ':00' : from) + 'Z';
      if (until) rule.valid.until = (until.length === 16 ? until + ':00' : until) + 'Z';
    }
    rule.events = [...document.querySelectorAll('#rule-events input:checked')].map((i) => i.value);
    if ($('rule-grant-option').checked) rule.grant_option = true;
    return rule;
  }

  // An error names its field (a JSON pointer); the input that holds it is outlined.
  function ruleError(r) {
    for (const e of document.querySelectorAll('#rule-editor .field-error')) e.classList.remove('field-error');
    const box = $('rule-error');
    if (!r) { box.hidden = true; box.dataset.field = ''; return; }
    const j = r.json || {};
    let field = typeof j.field === 'string' ? j.field.replace(/^\/rule(?=\/|$)/, '') : '';
    box.textContent = typeof j.error === 'string' ? j.error : r.error;
    box.dataset.field = field;
    box.hidden = false;
    while (field) {
      // (the error box carries the field too: it is not the field)
      const target = document.querySelector(`#rule-editor [data-field="${field}"]:not(#rule-error)`);
      if (target) { target.classList.add('field-error'); break; }
      field = field.replace(/\/[^/]*$/, '');
    }
  }

  function schedulePreview(delay) {
    clearTimeout(previewTimer);
    previewTimer = setTimeout(preview, delay === undefined ? 300 : delay);
  }

  function sampleConsumer(rule) {
    const subject = $('rule-sample-subject').value.trim();
    const roles = list($('rule-sample-roles').value);
    const who = rule.who;
    const guess = (who !== 'anyone' && who.subjects[0]) || 'someone';
    $('rule-sample-subject').placeholder = guess;
    if (!roles.length && who !== 'anyone' && !who.subjects.length && who.roles.length) {
      $('rule-sample-roles').placeholder = who.roles[0];
      return { subject: subject || guess, roles: [who.roles[0]] };
    }
    return { subject: subject || guess, roles };
  }

  async function preview() {
    if ($('rule-editor').hidden || !S.token) return;
    windowColumns();
    const seq = ++previewSeq;
    const rule = ruleFromForm();
    if (S.rule && S.rule.id) rule.id = S.rule.id;
    const body = { rule, consumer: sampleConsumer(rule), action: $('rule-sample-action').value };
    const r = await api('POST', '/rules/preview', { type: 'application/json', body: JSON.stringify(body) });
    if (seq !== previewSeq) return;  // a newer preview is on its way
    const editor = $('rule-editor');
    editor.dataset.previews = String(Number(editor.dataset.previews || 0) + 1);
    if (!r.ok) {
      ruleError(r);
      $('rule-summary').textContent = '—';
      $('rule-xacml').textContent = '';
      lastXacml = '';
      badge($('rule-explain-decision'), '—', '');
      $('rule-explain-note').textContent = '';
      $('rule-explain-sql').textContent = '';
      clear($('rule-warnings'));
      clear($('rule-explain-warnings'));
      editor.dataset.state = 'error';
      return;
    }
    ruleError(null);
    const j = r.json;
    lastXacml = j.xacml;
    $('rule-summary').textContent = j.summary || '—';
    $('rule-xacml').textContent = j.xacml;
    const ws = clear($('rule-warnings'));
    for (const w of j.warnings || []) ws.append(h('li', { class: 'PR', text: w }));
    const x = j.explain || {};
    badge($('rule-explain-decision'), x.decision || (x.status ? `refused (${x.status})` : '—'), x.decision || 'error');
    $('rule-explain-note').textContent = x.decision === 'Permit'
      ? `${x.consumer} (${x.action}) would get: ${planSummary(x.plan)}`
      : (x.error ? `${x.consumer} (${x.action}): ${x.error}` : '');
    const xw = clear($('rule-explain-warnings'));
    for (const w of x.warnings || []) xw.append(h('li', { class: w.kind, text: `${w.kind}: ${w.message}` }));
    $('rule-explain-sql').textContent = x.sql || '';
    editor.dataset.state = 'ok';
    editor.dataset.decision = x.decision || '';
  }

  $('rule-new').addEventListener('click', () => openRuleEditor(null, null));
  $('rule-close').addEventListener('click', closeRuleEditor);
  $('rule-stream').addEventListener('change', async () => {
    renderRuleAttributes(null);
    await renderRuleEvents([]);
    schedulePreview(0);
  });
  $('rule-window-type').addEventListener('change', () => { windowColumns(); schedulePreview(); });
  for (const id of ['rule-id', 'rule-description', 'rule-subjects', 'rule-roles', 'rule-who-attrs',
                    'rule-filter', 'rule-masks', 'rule-window-size', 'rule-window-step', 'rule-window-min',
                    'rule-valid-from', 'rule-valid-until', 'rule-sample-subject', 'rule-sample-roles']) {
    $(id).addEventListener('input', () => schedulePreview());
  }
  for (const id of ['rule-anyone', 'rule-any-action', 'rule-sample-action', 'rule-grant-option']) {
    $(id).addEventListener('change', () => schedulePreview());
  }
  for (const box of document.querySelectorAll('input[name=rule-action]')) {
    box.addEventListener('change', () => schedulePreview());
  }

  // Save: first what it would do (a dry run, decided against the live handles), then confirm.
  $('rule-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const rule = ruleFromForm();
    const id = S.rule && S.rule.id;
    const write = (query) => id
      ? api('PUT', `/policies/${enc(id)}${query}`, { type: RULE_TYPE, body: JSON.stringify(rule) })
      : api('POST', '/policies' + query, { type: RULE_TYPE, body: JSON.stringify(rule) });
    const dry = await write('?dry_run=true');
    if (!dry.ok) { ruleError(dry); setResult('rule-result', dry.error, false); return; }
    ruleError(null);
    const body = clear($('modal-body'));
    body.append(h('p', { class: 'code', text: $('rule-summary').textContent }));
    renderWhatIf(dry.json.what_if || { handles: 0, revoked: 0, changed: 0, kept: 0, consumers: [] }, body);
    for (const w of dry.json.warnings || []) body.append(h('p', { class: 'hint', text: `warning: ${w}` }));
    if (!await confirmModal(`${id ? 'Save a new version of' : 'Add'} ${dry.json.id}?`)) return;
    const r = await write('');
    if (!r.ok) { ruleError(r); setResult('rule-result', r.error, false); return; }
    S.rule = { id: r.json.id };
    $('rule-id').value = r.json.id;
    $('rule-id').readOnly = true;
    $('rule-title').textContent = `Sharing rule ${r.json.id}`;
    setResult('rule-result', `Saved ${r.json.id}: version ${r.json.version}, store version ${r.json.store_version}.`, true);
    await loadPolicies();
  });

  // The XACML from here on: the stored document, or (not saved yet) the compiled one.
  $('rule-as-xacml').addEventListener('click', async () => {
    const id = S.rule && S.rule.id;
    if (id) { await openPolicy(id); return; }
    if (!lastXacml) { flash('Fix the rule first: it does not compile yet.', true); return; }
    showEditor(null, lastXacml);
  });

  // -- Try a request ------------------------------------------------------------------------------

  async function loadTry() {
    const select = $('try-stream');
    const previous = select.value;
    if (!await fetchStreams()) return;
    clear(select);
    for (const s of S.streams) select.append(h('option', { value: s.name, text: `${s.name} (${s.owner})` }));
    if (previous && S.streams.some((s) => s.name === previous)) select.value = previous;
    renderMapChoices();
    renderRequestXml();
  }

  function currentStream() { return S.streams.find((s) => s.name === $('try-stream').value); }

  function renderMapChoices() {
    const box = $('try-map');
    for (const e of [...box.querySelectorAll('label')]) e.remove();
    const s = currentStream();
    if (!s) return;
    for (const f of s.schema) {
      box.append(h('label', { class: 'check' },
        h('input', { type: 'checkbox', value: f.name, onchange: renderRequestXml }), ` ${f.name}`));
    }
  }

  $('try-stream').addEventListener('change', () => { renderMapChoices(); renderRequestXml(); });
  for (const id of ['try-action', 'try-filter', 'try-masks', 'try-window-type', 'try-window-size', 'try-window-step',
                    'try-window-min', 'try-window-aggs', 'try-window-keys']) {
    $(id).addEventListener('input', renderRequestXml);
  }

  function esc(text) {
    return String(text).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
      .replace(/"/g, '&quot;');
  }

  const list = (text) => text.split(',').map((x) => x.trim()).filter(Boolean);

  function buildRequestXml() {
    const stream = $('try-stream').value;
    const action = $('try-action').value;
    const filter = $('try-filter').value.trim();
    const map = [...document.querySelectorAll('#try-map input:checked')].map((i) => i.value);
    const wtype = $('try-window-type').value;
    const q = [];
    if (filter) q.push(`        <Filter><FilterCondition>${esc(filter)}</FilterCondition></Filter>`);
    if (map.length) q.push(`        <Map>${map.map((a) => `<Attribute>${esc(a)}</Attribute>`).join('')}</Map>`);
    const masks = $('try-masks').value.split(';').map((x) => x.trim()).filter(Boolean);
    if (masks.length) q.push(`        <Mask>${masks.map((m) => `<Attribute>${esc(m)}</Attribute>`).join('')}</Mask>`);
    if (wtype) {
      const agg = [`<WindowType>${esc(wtype)}</WindowType>`,
                   `<WindowSize>${esc($('try-window-size').value)}</WindowSize>`,
                   `<WindowStep>${esc($('try-window-step').value)}</WindowStep>`];
      for (const a of list($('try-window-aggs').value)) agg.push(`<Attribute>${esc(a)}</Attribute>`);
      for (const k of list($('try-window-keys').value)) agg.push(`<Key>${esc(k)}</Key>`);
      if ($('try-window-min').value) agg.push(`<MinCount>${esc($('try-window-min').value)}</MinCount>`);
      q.push(`        <Aggregation>\n          ${agg.join('\n          ')}\n        </Aggregation>`);
    }
    const content = q.length
      ? `    <Content>\n      <UserQuery xmlns="">\n        <Stream name="${esc(stream)}"/>\n${q.join('\n')}\n      </UserQuery>\n    </Content>\n`
      : '';
    const attr = (id, value) =>
      `    <Attribute AttributeId="${id}" IncludeInResult="false">\n` +
      `      <AttributeValue DataType="http://www.w3.org/2001/XMLSchema#string">${esc(value)}</AttributeValue>\n    </Attribute>\n`;
    return `<?xml version="1.0" encoding="UTF-8"?>
<Request xmlns="${XACML_NS}" ReturnPolicyIdList="false" CombinedDecision="false">
  <Attributes Category="urn:oasis:names:tc:xacml:1.0:subject-category:access-subject">
${attr('urn:oasis:names:tc:xacml:1.0:subject:subject-id', S.me ? S.me.subject : '')}  </Attributes>
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:resource">
${content}${attr('urn:oasis:names:tc:xacml:1.0:resource:resource-id', stream)}  </Attributes>
  <Attributes Category="urn:oasis:names:tc:xacml:3.0:attribute-category:action">
${attr('urn:oasis:names:tc:xacml:1.0:action:action-id', action)}  </Attributes>
</Request>
`;
  }

  function renderRequestXml() { $('try-xml').textContent = buildRequestXml(); }

  function resetTryResult() {
    badge($('try-decision'), '—', '');
    $('try-stream-name').textContent = '';
    $('try-error').hidden = true;
    clear($('try-warnings')).append(h('li', { class: 'hint', text: 'none yet' }));
    $('try-plan').textContent = '';
    $('try-sql').textContent = '';
    $('try-policies').textContent = '';
    $('try-why').textContent = '';
    clear($('try-handle'));
  }

  // An explanation of POST /pdp?explain=1 (pdp/why.py's JSON, as the caller may see it) as text.
  function whyText(x) {
    if (!x) return '';
    const out = [`decision: ${x.decision}${x.status ? ` (${x.status})` : ''}`];
    if (x.view === 'consumer') { out.push(`reason: ${x.reason}`); return out.join('\n'); }
    const walk = (n, depth) => {
      const pad = '  '.repeat(depth);
      out.push(`${pad}${n.kind}${n.id ? ' ' + n.id : ''}${n.line ? ` (line ${n.line})` : ''} -> ${n.decision}${n.status ? ': ' + n.status : ''}`);
      if (n.target) {
        out.push(`${pad}  target: ${n.target.result}`);
        for (const m of n.target.matches) {
          const got = m.request ? ` (request: ${m.request.join(', ') || 'none'})` : '';
          out.push(`${pad}    ${m.category} ${m.attribute} ${m.function} '${m.value}': ${m.result}${got}`);
        }
      }
      if (n.condition) out.push(`${pad}  condition: ${n.condition}`);
      for (const r of n.reads || []) out.push(`${pad}    reads ${r.category} ${r.attribute}: ${r.present ? 'present' : 'missing'}`);
      if (n.combining) out.push(`${pad}  ${n.combining}`);
      for (const c of n.children || []) walk(c, depth + 1);
      if (n.other_policies) {
        out.push(`${pad}  policies you do not manage: ${Object.entries(n.other_policies).map(([k, v]) => `${k}: ${v}`).join(', ')}`);
      }
    };
    walk(x.root, 0);
    for (const o of x.obligations || []) {
      out.push(`obligation ${o.id} from ${typeof o.from === 'string' ? o.from : `${o.from.kind.toLowerCase()} ${o.from.id}`}`);
    }
    const missing = x.missing_attributes || [];
    out.push(`missing attributes: ${missing.map((m) => `${m.category} ${m.attribute}`).join(', ') || 'none'}`);
    return out.join('\n');
  }

  async function showWhy(xml) {
    const r = await api('POST', '/pdp?explain=1', { type: 'application/xacml+xml', body: xml });
    $('try-why').textContent = r.ok && r.json ? whyText((r.json.explanations || [])[0]) : (r.error || '');
  }

  function showGrant(j) {
    badge($('try-decision'), j.decision || 'Permit');
    $('try-stream-name').textContent = j.stream ? `on ${j.stream}` : '';
    const ul = clear($('try-warnings'));
    for (const w of j.warnings || []) {
      ul.append(h('li', { class: w.kind, text: `${w.kind}${w.operator ? ` (${w.operator})` : ''}: ${w.message}` }));
    }
    if (!(j.warnings || []).length) ul.append(h('li', { class: 'hint', text: 'none' }));
    $('try-plan').textContent = j.plan ? JSON.stringify(j.plan, null, 2) : '';
    $('try-sql').textContent = j.sql || '';
    const pols = j.policies || j.policy_ids || [];
    $('try-policies').textContent = pols.length ? `Policies: ${pols.join(', ')}` : '';
  }

  function showRefusal(r) {
    const x = r.ctype.includes('xacml') ? xacmlDecision(r.text) : null;
    badge($('try-decision'), x ? x.decision : `refused (${r.status})`, x ? x.decision : 'error');
    $('try-error').textContent = r.error;
    $('try-error').hidden = false;
    const ul = clear($('try-warnings'));
    const j = r.json || {};
    for (const w of j.warnings || (j.warning ? [j.warning] : [])) {
      ul.append(h('li', { class: w.kind, text: `${w.kind}: ${w.message}` }));
    }
  }

  $('try-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    resetTryResult();
    const xml = buildRequestXml();
    $('try-xml').textContent = xml;
    const r = await api('POST', '/explain', { type: 'application/xacml+xml', body: xml });
    if (!r.ok) showRefusal(r); else showGrant(r.json);
    await showWhy(xml);
  });

  $('try-open').addEventListener('click', async () => {
    resetTryResult();
    const xml = buildRequestXml();
    $('try-xml').textContent = xml;
    const r = await api('POST', '/requests', { type: 'application/xacml+xml', body: xml });
    if (!r.ok) { showRefusal(r); return; }
    showGrant(Object.assign({ decision: 'Permit' }, r.json));
    const p = clear($('try-handle'));
    p.className = 'result ok';
    p.append(`${r.json.new ? 'Opened' : 'Already open:'} handle on ${r.json.stream}. `,
      h('a', { href: '#handles', id: 'try-watch', 'data-handle': r.json.id, text: 'Watch it live',
               onclick: (e) => { e.preventDefault(); watchHandle(r.json.id); } }));
  });

  // -- My handles ---------------------------------------------------------------------------------

  // One predicate of a plan; spatial ones (DISTANCE, DISTANCE_TO, WITHIN_POLYGON) name their function.
  function predicateText(p) {
    if (!p.function) return p.mask ? `${p.mask}(${p.attribute}) ${p.op} ${p.value}` : `${p.attribute} ${p.op} ${p.value}`;
    const coords = (p.attributes || [p.latitude, p.longitude]).join(', ');
    if (p.function === 'polygon') return `${p.op === '!=' ? 'NOT ' : ''}WITHIN_POLYGON(${coords}, ...)`;
    return `${p.function.toUpperCase()}(${coords}, ...) ${p.op} ${p.metres ?? p.value}`;
  }

  // A handle's plan (its stored form: filter_dnf, window.kind) or an explained one (filter, type).
  function planSummary(plan) {
    if (!plan) return '';
    const parts = [];
    const dnf = plan.filter || plan.filter_dnf;
    if (dnf && dnf.length) {
      parts.push('filter ' + dnf.map((c) => c.map(predicateText).join(' AND ')).join(' OR '));
    }
    const w = plan.window;
    if (w) parts.push(`${w.type || w.kind} window ${w.size}/${w.step}`);
    const output = plan.output || (w ? [...(w.keys || []), ...(w.aggregates || []).map((a) => `${a.function}_${a.attribute}`)]
      : plan.projection);
    if (output && output.length) parts.push('columns ' + output.join(', '));
    // masks: {attribute: spec} when explained, [[attribute, spec], ...] when stored
    const masks = Array.isArray(plan.masks) ? plan.masks : Object.entries(plan.masks || {});
    if (masks.length) parts.push('masked ' + masks.map(([a, m]) => `${a} as ${m}`).join(', '));
    return parts.join(' · ');
  }

  async function loadHandles() {
    const r = await api('GET', '/handles');
    if (!r.ok) { flash(r.error, true); return; }
    S.handles = r.json.handles || [];
    const body = clear($('handles-table').querySelector('tbody'));
    const shown = [...S.handles].reverse();
    for (const x of shown) {
      const state = h('span', {}); badge(state, x.state);
      const buttons = x.state === 'live' ? [
        h('button', { type: 'button', class: 'small', text: 'Watch', onclick: () => watchHandle(x.id) }),
        h('button', { type: 'button', class: 'danger small', text: 'Release', onclick: () => release(x.id) }),
      ] : [];
      body.append(h('tr', { 'data-handle': x.id, class: S.live && S.live.id === x.id ? 'selected' : null },
        h('td', { text: x.stream }), h('td', {}, state), h('td', { text: x.reason || '' }),
        h('td', { text: x.created_at || '' }), h('td', { text: planSummary(x.plan) }), h('td', {}, buttons)));
    }
    $('handles-empty').hidden = S.handles.length > 0;
  }

  $('handles-refresh').addEventListener('click', loadHandles);

  async function release(id) {
    const r = await api('DELETE', `/handles/${enc(id)}`);
    if (!r.ok) flash(r.error, true);
    else flash('Released the handle.');
    loadHandles();
  }

  async function watchHandle(id) {
    if (location.hash !== '#handles') {
      location.hash = '#handles';  // route() loads the table
    }
    await loadHandles();
    const record = S.handles.find((x) => x.id === id);
    if (!record) { flash('No such handle.', true); return; }
    openLive(record);
  }

  // The live view: one EventSource on the handle, a table, a chart and, for positions, a map.
  function closeLive() {
    const L = S.live;
    if (L) {
      L.closed = true;
      if (L.es) L.es.close();
      clearTimeout(L.retryTimer);
    }
    S.live = null;
    $('live').hidden = true;
  }

  function openLive(record) {
    closeLive();
    const L = S.live = {
      id: record.id, stream: record.stream, plan: record.plan, rows: [], count: 0, lastId: null,
      es: null, final: null, closed: false, attr: null, columns: [], ships: new Map(),
      bounds: null, drawPending: false, retries: 0, retryTimer: null,
    };
    $('live').hidden = false;
    $('live').dataset.handle = L.id;
    $('live-stream').textContent = L.stream;
    $('live-count').textContent = '0';
    $('live-last').textContent = '—';
    clear($('live-events'));
    clear($('live-rows').querySelector('thead'));
    clear($('live-rows').querySelector('tbody'));
    clear($('live-attr'));
    $('live-release').disabled = false;
    $('live-map-box').hidden = true;
    $('live-chart').dataset.points = '0';
    $('live-map').dataset.points = '0';
    for (const tr of document.querySelectorAll('#handles-table tbody tr')) {
      tr.classList.toggle('selected', tr.dataset.handle === L.id);
    }
    draw();
    connectLive(L);
  }

  function setLiveStatus(L, text) {
    if (S.live !== L) return;
    badge($('live-status'), text);
    $('live').dataset.status = text;
  }

  function logEvent(L, kind, text) {
    if (S.live !== L) return;
    const time = new Date().toLocaleTimeString();
    $('live-events').prepend(h('li', { class: kind, 'data-kind': kind, text: `${time} ${kind}: ${text}` }));
  }

  async function connectLive(L) {
    if (L.closed || L.final) return;
    setLiveStatus(L, L.count ? 'reconnecting' : 'connecting');
    const r = await api('POST', `/handles/${enc(L.id)}/read-token`);
    if (L.closed) return;
    if (!r.ok) {
      if (r.status === 410 && r.json) { finish(L, r.json.state || 'ended', r.json.reason || ''); return; }
      setLiveStatus(L, 'error');
      logEvent(L, 'error', r.error);
      return;
    }
    let url = `/handles/${enc(L.id)}?read_token=${enc(r.json.read_token)}`;
    if (L.lastId !== null) url += `&last_event_id=${enc(L.lastId)}`;
    const es = new EventSource(url);
    L.es = es;
    es.onopen = () => { L.retries = 0; setLiveStatus(L, 'live'); };
    es.onmessage = (ev) => onRow(L, ev);
    es.addEventListener('gap', (ev) => {
      const d = safeJson(ev.data);
      L.lastId = ev.lastEventId || L.lastId;
      logEvent(L, 'gap', d.lost === null || d.lost === undefined ? 'rows were lost in a gateway restart'
        : `${d.lost} row(s) were dropped (the reader was too slow or away)`);
    });
    for (const kind of FINAL_EVENTS) {
      es.addEventListener(kind, (ev) => {
        const d = safeJson(ev.data);
        L.lastId = ev.lastEventId || L.lastId;
        if (kind === 'shutdown') {
          es.close();
          logEvent(L, 'shutdown', 'the gateway is stopping; reconnecting when it is back');
          scheduleReconnect(L, 3000);
          return;
        }
        finish(L, kind, d.reason || '');
      });
    }
    es.onerror = () => {
      // The connection failed or ended without a final event. The browser's own retry would
      // reuse this URL, whose token may have expired: close it and resume under our control.
      if (L.closed || L.final || L.es !== es) return;
      es.close();
      setLiveStatus(L, 'reconnecting');
      recover(L);
    };
  }

  function scheduleReconnect(L, delay) {
    clearTimeout(L.retryTimer);
    L.retryTimer = setTimeout(() => connectLive(L), delay);
  }

  // Is the handle still live? Then reconnect with a fresh token after the last row we have.
  async function recover(L) {
    const r = await api('GET', `/handles/${enc(L.id)}`, { accept: 'application/json' });
    if (L.closed || L.final) return;
    if (r.status === 410 && r.json) { finish(L, r.json.state || 'ended', r.json.reason || ''); return; }
    if (r.status === 404) { finish(L, 'ended', 'the handle no longer exists'); return; }
    scheduleReconnect(L, Math.min(250 * Math.pow(2, L.retries++), 10000));
  }

  function finish(L, kind, reason) {
    if (L.final) return;
    L.final = kind;
    if (L.es) L.es.close();
    setLiveStatus(L, kind);
    logEvent(L, kind, reason || '(no reason given)');
    if (S.live === L) $('live-release').disabled = true;
    if (document.body.dataset.page === 'handles') loadHandles();
  }

  function safeJson(text) { try { return JSON.parse(text) || {}; } catch (e) { return {}; } }

  function onRow(L, ev) {
    const row = safeJson(ev.data);
    L.count++;
    L.lastId = ev.lastEventId || L.lastId;
    L.rows.push({ id: Number(ev.lastEventId), row });
    if (L.rows.length > KEEP_ROWS) L.rows.splice(0, L.rows.length - KEEP_ROWS);
    if (!L.columns.length) setupColumns(L, row);
    if (typeof row.lat === 'number' && typeof row.lon === 'number') {
      const key = row.mmsi !== undefined ? String(row.mmsi) : row.shipname !== undefined ? String(row.shipname) : 'point';
      let trail = L.ships.get(key);
      if (!trail) { trail = []; L.ships.set(key, trail); }
      trail.push([row.lon, row.lat]);
      if (trail.length > TRAIL) trail.shift();
      const b = L.bounds || { minLat: row.lat, maxLat: row.lat, minLon: row.lon, maxLon: row.lon };
      b.minLat = Math.min(b.minLat, row.lat); b.maxLat = Math.max(b.maxLat, row.lat);
      b.minLon = Math.min(b.minLon, row.lon); b.maxLon = Math.max(b.maxLon, row.lon);
      L.bounds = b;
    }
    if (!L.drawPending) {
      L.drawPending = true;
      requestAnimationFrame(() => { L.drawPending = false; if (S.live === L) draw(); });
    }
  }

  function setupColumns(L, row) {
    L.columns = Object.keys(row);
    const head = clear($('live-rows').querySelector('thead'));
    head.append(h('tr', {}, h('th', { text: 'id' }), L.columns.map((c) => h('th', { text: c }))));
    const numeric = L.columns.filter((c) => typeof row[c] === 'number' && c !== 'mmsi');
    const preferred = numeric.find((c) => /^(avg|sum|max|min|count|firstval|lastval)_/.test(c))
      || numeric.find((c) => !['lat', 'lon'].includes(c)) || numeric[0] || null;
    const select = clear($('live-attr'));
    for (const c of numeric) select.append(h('option', { value: c, text: c }));
    if (preferred) select.value = preferred;
    L.attr = preferred;
    $('live-map-box').hidden = !(L.columns.includes('lat') && L.columns.includes('lon'));
  }

  $('live-attr').addEventListener('change', () => { if (S.live) { S.live.attr = $('live-attr').value; draw(); } });
  $('live-close').addEventListener('click', closeLive);
  $('live-release').addEventListener('click', () => { if (S.live) release(S.live.id); });

  function fmt(v) {
    if (typeof v === 'number') return Number.isInteger(v) ? String(v) : v.toFixed(Math.abs(v) < 10 ? 3 : 2);
    if (v === null || v === undefined) return '';
    return typeof v === 'object' ? JSON.stringify(v) : String(v);
  }

  function draw() {
    const L = S.live;
    if (!L) return;
    $('live-count').textContent = String(L.count);
    $('live-last').textContent = L.lastId === null ? '—' : String(L.lastId);
    $('live').dataset.rows = String(L.count);
    const body = clear($('live-rows').querySelector('tbody'));
    for (const { id, row } of L.rows.slice(-TABLE_ROWS).reverse()) {
      body.append(h('tr', {}, h('td', { text: String(id) }), L.columns.map((c) => h('td', { text: fmt(row[c]) }))));
    }
    drawChart(L);
    if (!$('live-map-box').hidden) drawMap(L);
  }

  function niceTicks(min, max, count) {
    if (!(max > min)) { const pad = Math.abs(min) * 0.1 || 1; min -= pad; max += pad; }
    const raw = (max - min) / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((s) => s * mag).find((s) => s >= raw) || raw;
    const lo = Math.floor(min / step) * step, hi = Math.ceil(max / step) * step;
    const ticks = [];
    for (let t = lo; t <= hi + step / 2; t += step) ticks.push(Number(t.toPrecision(12)));
    return { lo, hi, ticks };
  }

  function drawChart(L) {
    const c = $('live-chart');
    const g = c.getContext('2d');
    const W = c.width, H = c.height, left = 56, right = 12, top = 14, bottom = 28;
    g.clearRect(0, 0, W, H);
    g.font = '11px sans-serif';
    const pts = L.attr ? L.rows.filter((r) => typeof r.row[L.attr] === 'number').map((r) => [r.id, r.row[L.attr]]) : [];
    c.dataset.points = String(pts.length);
    c.dataset.attr = L.attr || '';
    g.fillStyle = '#5d6677';
    if (!pts.length) { g.fillText(L.attr ? 'waiting for rows…' : 'no numeric attribute yet', left, H / 2); return; }
    const ys = pts.map((p) => p[1]);
    const y = niceTicks(Math.min(...ys), Math.max(...ys), 5);
    const x0 = pts[0][0], x1 = Math.max(pts[pts.length - 1][0], x0 + 1);
    const X = (v) => left + (v - x0) / (x1 - x0) * (W - left - right);
    const Y = (v) => H - bottom - (v - y.lo) / (y.hi - y.lo) * (H - top - bottom);
    g.strokeStyle = '#e3e7ee'; g.lineWidth = 1;
    g.textAlign = 'right'; g.textBaseline = 'middle';
    for (const t of y.ticks) {
      g.beginPath(); g.moveTo(left, Y(t)); g.lineTo(W - right, Y(t)); g.stroke();
      g.fillText(fmt(t), left - 6, Y(t));
    }
    g.textAlign = 'center'; g.textBaseline = 'top';
    g.fillText(`event id ${x0} … ${pts[pts.length - 1][0]}`, (left + W - right) / 2, H - bottom + 8);
    g.strokeStyle = '#2457c5'; g.lineWidth = 1.6;
    g.beginPath();
    pts.forEach((p, i) => { if (i) g.lineTo(X(p[0]), Y(p[1])); else g.moveTo(X(p[0]), Y(p[1])); });
    g.stroke();
    g.fillStyle = '#2457c5';
    for (const p of pts.slice(-60)) { g.beginPath(); g.arc(X(p[0]), Y(p[1]), 2, 0, 2 * Math.PI); g.fill(); }
    g.textAlign = 'left'; g.textBaseline = 'top'; g.fillStyle = '#1d2330';
    g.fillText(`${L.attr}: ${fmt(ys[ys.length - 1])}`, left + 6, top);
  }

  function drawMap(L) {
    const c = $('live-map');
    const g = c.getContext('2d');
    const W = c.width, H = c.height, left = 58, right = 14, top = 12, bottom = 34;
    g.clearRect(0, 0, W, H);
    g.font = '11px sans-serif';
    c.dataset.points = String(L.ships.size);
    if (!L.bounds) return;
    const b = L.bounds;
    const padLat = (b.maxLat - b.minLat) * 0.1 || 0.05, padLon = (b.maxLon - b.minLon) * 0.1 || 0.05;
    const lat = niceTicks(b.minLat - padLat, b.maxLat + padLat, 5);
    const lon = niceTicks(b.minLon - padLon, b.maxLon + padLon, 6);
    const X = (v) => left + (v - lon.lo) / (lon.hi - lon.lo) * (W - left - right);
    const Y = (v) => H - bottom - (v - lat.lo) / (lat.hi - lat.lo) * (H - top - bottom);
    g.strokeStyle = '#e3e7ee'; g.fillStyle = '#5d6677'; g.lineWidth = 1;
    g.textAlign = 'right'; g.textBaseline = 'middle';
    for (const t of lat.ticks) { g.beginPath(); g.moveTo(left, Y(t)); g.lineTo(W - right, Y(t)); g.stroke(); g.fillText(fmt(t) + '°', left - 5, Y(t)); }
    g.textAlign = 'center'; g.textBaseline = 'top';
    for (const t of lon.ticks) { g.beginPath(); g.moveTo(X(t), top); g.lineTo(X(t), H - bottom); g.stroke(); g.fillText(fmt(t) + '°', X(t), H - bottom + 4); }
    g.fillText('longitude', (left + W - right) / 2, H - 14);
    g.save(); g.translate(12, (top + H - bottom) / 2); g.rotate(-Math.PI / 2); g.fillText('latitude', 0, -6); g.restore();
    let k = 0;
    for (const [key, trail] of L.ships) {
      const hue = (k++ * 67) % 360;
      g.strokeStyle = `hsla(${hue}, 65%, 45%, 0.35)`; g.lineWidth = 1.5;
      g.beginPath();
      trail.forEach(([x, y], i) => { if (i) g.lineTo(X(x), Y(y)); else g.moveTo(X(x), Y(y)); });
      g.stroke();
      const [x, y] = trail[trail.length - 1];
      g.fillStyle = `hsl(${hue}, 65%, 42%)`;
      g.beginPath(); g.arc(X(x), Y(y), 4, 0, 2 * Math.PI); g.fill();
      if (L.ships.size <= 12) { g.textAlign = 'left'; g.textBaseline = 'bottom'; g.fillText(key, X(x) + 5, Y(y) - 2); }
    }
  }

  route();
})();

// tilefarm monitor: a single page over the coordinator's API. Everything it shows comes from
// the API with the bearer token kept in this tab's sessionStorage; GET /v1/events says what
// changed, and the page fetches what it shows.
'use strict';
(() => {
  const TOKEN_KEY = 'tilefarm.token';
  const $ = (sel, root = document) => root.querySelector(sel);
  const view = $('#view');
  const jobs = new Map(); // job id -> status without frames, as the stream and /v1/jobs tell
  let authed = false;
  let stream = null; // AbortController of the event stream
  let route = null;
  let viewTimers = [];
  let frameState = null; // the frame view's drawing state
  let movieURL = null; // the object URL the job view's movie plays, revoked when the view changes
  let jobState = null; // the job view's contact sheet
  // jobRefresh is the job view's refresh, called on events about its job: at most every
  // jobRefreshEvery, or at once with now (after a button of the page).
  let jobRefresh = null;
  const jobRefreshEvery = 2000;
  let viewRefresh = () => {}; // the dead letters', a dead letter's or a tile's view's refresh

  class Unauthorized extends Error {}

  const token = () => sessionStorage.getItem(TOKEN_KEY) || '';
  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const t = token();
    if (t) h.Authorization = 'Bearer ' + t;
    return h;
  }

  async function api(path, opts = {}) {
    const res = await fetch(path, Object.assign({ cache: 'no-store' }, opts, { headers: headers(opts.headers) }));
    if (res.status === 401) {
      needToken();
      throw new Unauthorized('the API token is missing or wrong');
    }
    return res;
  }

  async function apiJSON(path, opts) {
    const res = await api(path, opts);
    const body = await res.json().catch(() => null);
    if (!res.ok) throw new Error((body && body.error) || `${res.status} ${res.statusText}`);
    return body;
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k === 'class') e.className = v;
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) if (c != null) e.append(c instanceof Node ? c : String(c));
    return e;
  }

  const badge = (state) => el('span', { class: 'state s-' + state }, state);
  const pct = (done, total) => (total > 0 ? Math.floor((100 * done) / total) + '%' : '–');
  const terminal = (state) => state === 'completed' || state === 'failed' || state === 'cancelled';
  function duration(s) {
    if (s == null || !isFinite(s)) return '–';
    s = Math.max(0, Math.round(s));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (h) return `${h}h ${String(m).padStart(2, '0')}m`;
    if (m) return `${m}m ${String(sec).padStart(2, '0')}s`;
    return `${sec}s`;
  }
  const age = (created) => (created ? duration((Date.now() - Date.parse(created)) / 1000) : '–');

  function setLive(text) { $('#live').textContent = text; }
  function showMessage(text) {
    const m = $('#message');
    m.textContent = text;
    m.hidden = !text;
  }
  function fail(e) {
    if (!(e instanceof Unauthorized)) showMessage(e.message || String(e));
  }

  // A 401 anywhere: forget everything shown, ask for the token.
  function needToken() {
    const hadToken = token() !== '';
    authed = false;
    jobs.clear();
    stopView();
    view.replaceChildren();
    stopStream();
    if (hadToken) sessionStorage.removeItem(TOKEN_KEY);
    const form = $('#token-form');
    if (form.hidden) {
      form.hidden = false;
      $('#token-input').value = '';
      $('#token-input').focus();
    }
    showMessage(hadToken ? 'The token was refused.' : '');
    setLive('token required');
  }

  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = $('#token-input').value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    $('#token-input').value = '';
    $('#token-form').hidden = true;
    showMessage('');
    start();
  });

  // The event stream, read with fetch so the token stays in a header.
  function stopStream() {
    if (stream) stream.abort();
    stream = null;
  }

  async function startStream() {
    stopStream();
    const ctl = new AbortController();
    stream = ctl;
    try {
      const res = await fetch('/v1/events', { headers: headers({ Accept: 'text/event-stream' }), signal: ctl.signal, cache: 'no-store' });
      if (res.status === 401) {
        needToken();
        return;
      }
      if (!res.ok || !res.body) throw new Error('event stream: ' + res.status);
      setLive('live');
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          dispatch(buf.slice(0, i));
          buf = buf.slice(i + 2);
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
    }
    if (stream === ctl) {
      setLive('reconnecting');
      setTimeout(() => { if (stream === ctl) startStream(); }, 2000);
    }
  }

  function dispatch(block) {
    let event = 'message';
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) continue;
      if (line.startsWith('event:')) event = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (!data.length) return;
    let payload;
    try { payload = JSON.parse(data.join('\n')); } catch (e) { return; }
    if (event === 'jobs') {
      for (const st of payload) jobs.set(st.job_id, st);
      if (route.name === 'jobs') renderJobs();
      if (route.name === 'job' && payload.some((s) => s.job_id === route.id) && jobRefresh) jobRefresh();
      if (route.name === 'dlq' || route.name === 'deadLetter') viewRefresh();
    } else if (event === 'frame') {
      for (const f of payload) {
        if (route.name === 'frame' && f.job_id === route.id && f.frame === route.frame && frameState) frameState.refresh();
        if (route.name === 'job' && f.job_id === route.id && jobState) jobState.frameEvent(f);
        if (route.name === 'job' && f.job_id === route.id && jobRefresh) jobRefresh();
        if (route.name === 'tile' && f.job_id === route.id && f.frame === route.frame) viewRefresh();
      }
    }
  }

  // Routing.
  function parseRoute() {
    const h = location.hash.replace(/^#/, '') || '/';
    let m;
    if ((m = h.match(/^\/jobs\/([^/]+)\/frames\/(-?\d+)\/tiles\/(\d+)$/))) return { name: 'tile', id: decodeURIComponent(m[1]), frame: Number(m[2]), index: Number(m[3]) };
    if ((m = h.match(/^\/jobs\/([^/]+)\/frames\/(-?\d+)$/))) return { name: 'frame', id: decodeURIComponent(m[1]), frame: Number(m[2]) };
    if ((m = h.match(/^\/jobs\/([^/]+)$/))) return { name: 'job', id: decodeURIComponent(m[1]) };
    if (h === '/workers') return { name: 'workers' };
    if (h === '/dlq') return { name: 'dlq' };
    if ((m = h.match(/^\/dlq\/(\d+)$/))) return { name: 'deadLetter', seq: Number(m[1]) };
    return { name: 'jobs' };
  }

  function stopView() {
    if (movieURL) URL.revokeObjectURL(movieURL);
    movieURL = null;
    for (const t of viewTimers) clearInterval(t); // clears the timeouts among them too
    viewTimers = [];
    frameState = null;
    if (jobState) jobState.observer.disconnect();
    jobState = null;
    jobRefresh = null;
    viewRefresh = () => {};
  }
  const every = (ms, fn) => viewTimers.push(setInterval(fn, ms));

  async function render() {
    stopView();
    route = parseRoute();
    for (const [id, name] of [['nav-jobs', 'jobs'], ['nav-workers', 'workers'], ['nav-dlq', 'dlq']]) {
      if (route.name === name || (name === 'jobs' && ['job', 'frame', 'tile'].includes(route.name)) || (name === 'dlq' && route.name === 'deadLetter')) $('#' + id).setAttribute('aria-current', 'page');
      else $('#' + id).removeAttribute('aria-current');
    }
    showMessage('');
    view.replaceChildren();
    if (!authed) return;
    try {
      await views[route.name](route);
    } catch (e) {
      fail(e);
    }
  }

  // Jobs.
  let jobRows = new Map();

  async function jobsView() {
    jobRows = new Map();
    const table = el('table', { id: 'jobs' },
      el('caption', { class: 'muted' }, 'Every job, newest first'),
      el('thead', {}, el('tr', {},
        el('th', { scope: 'col' }, 'Job'), el('th', { scope: 'col' }, 'State'), el('th', { scope: 'col' }, 'Frames'),
        el('th', { scope: 'col', class: 'hide-narrow' }, 'Tiles'), el('th', { scope: 'col' }, 'Samples'),
        el('th', { scope: 'col' }, 'ETA'), el('th', { scope: 'col' }, 'Priority'), el('th', { scope: 'col', class: 'hide-narrow' }, 'Age'),
        el('th', { scope: 'col' }, 'Actions'))),
      el('tbody', {}));
    // The view is drawn before the list is asked for, as every view is: drawn after, it would
    // replace a view routed to while the list loaded (the page's first view, say).
    view.replaceChildren(el('h2', {}, 'Jobs'), el('div', { class: 'scroll' }, table));
    every(1000, () => {
      for (const [id, tr] of jobRows) {
        const st = jobs.get(id);
        if (st) $('[data-col=age]', tr).textContent = age(st.created);
      }
    });
    renderJobs();
    const list = await apiJSON('/v1/jobs');
    for (const st of list) jobs.set(st.job_id, st);
    renderJobs(); // a no-op once another view replaced this one
  }

  function renderJobs() {
    const tbody = $('#jobs tbody');
    if (!tbody) return;
    const sorted = [...jobs.values()].sort((a, b) => (b.created || '').localeCompare(a.created || ''));
    for (const st of sorted) {
      let tr = jobRows.get(st.job_id);
      if (!tr) {
        tr = jobRow(st);
        jobRows.set(st.job_id, tr);
      }
      fillJobRow(tr, st);
    }
    // Keep the order newest first without moving the row being typed in.
    const order = sorted.map((s) => jobRows.get(s.job_id));
    if (order.some((tr, i) => tbody.children[i] !== tr) && !tbody.contains(document.activeElement)) tbody.replaceChildren(...order);
    else for (const tr of order) if (!tr.isConnected) tbody.prepend(tr);
    if (!sorted.length && !$('#no-jobs')) tbody.append(el('tr', { id: 'no-jobs' }, el('td', { colspan: 9, class: 'muted' }, 'No jobs yet.')));
    if (sorted.length && $('#no-jobs')) $('#no-jobs').remove();
  }

  // A job's state, and for one that waits for other jobs what it waits for, or why it is blocked.
  function stateOf(st) {
    const why = st.state === 'blocked' ? st.blocked_reason : st.state === 'waiting' ? st.waiting_for : '';
    return why ? [badge(st.state), el('br'), el('span', { class: 'muted', 'data-why': st.state }, why)] : [badge(st.state)];
  }

  function jobActions(st) {
    const input = el('input', { type: 'number', min: -100, max: 100, step: 1, value: st.priority, 'aria-label': 'Priority of ' + st.job_id, 'data-priority-input': st.job_id });
    return el('span', { class: 'actions' },
      el('button', { type: 'button', 'data-action': 'cancel', 'data-job': st.job_id, 'aria-label': 'Cancel ' + st.job_id, onclick: () => cancelJob(st.job_id) }, 'Cancel'),
      ' ', input, ' ',
      el('button', { type: 'button', 'data-action': 'priority', 'data-job': st.job_id, 'aria-label': 'Set the priority of ' + st.job_id,
        onclick: () => setPriority(st.job_id, input.value) }, 'Set'));
  }

  function jobRow(st) {
    return el('tr', { 'data-job': st.job_id },
      el('td', {}, el('a', { href: '#/jobs/' + encodeURIComponent(st.job_id) }, st.job_id), el('br'), el('span', { class: 'muted' }, st.scene)),
      el('td', { 'data-col': 'state' }), el('td', { 'data-col': 'frames' }), el('td', { 'data-col': 'tiles', class: 'hide-narrow' }),
      el('td', { 'data-col': 'samples' }), el('td', { 'data-col': 'eta' }), el('td', { 'data-col': 'priority' }),
      el('td', { 'data-col': 'age', class: 'hide-narrow' }), el('td', { 'data-col': 'actions' }, jobActions(st)));
  }

  function fillJobRow(tr, st) {
    const set = (col, ...content) => $(`[data-col=${col}]`, tr).replaceChildren(...content);
    set('state', ...stateOf(st));
    set('frames', `${st.frames_completed}/${st.frames_total}` + (st.frames_failed ? `, ${st.frames_failed} failed` : ''));
    set('tiles', `${st.tiles_completed}/${st.tiles_total}` + (st.tiles_failed ? `, ${st.tiles_failed} failed` : ''));
    set('samples', pct(st.samples_done, st.samples_total));
    set('eta', st.eta_seconds != null ? duration(st.eta_seconds) : '–');
    set('priority', String(st.priority));
    $('[data-col=age]', tr).textContent = age(st.created);
    const input = $('input', tr);
    if (document.activeElement !== input && input.dataset.shown !== String(st.priority)) {
      input.value = st.priority;
      input.dataset.shown = String(st.priority);
    }
    $('[data-action=cancel]', tr).disabled = terminal(st.state);
  }

  async function cancelJob(id) {
    try {
      const st = await apiJSON(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: 'POST' });
      delete st.frames;
      jobs.set(id, st);
      showMessage('');
      if (route.name === 'jobs') renderJobs();
      if (jobRefresh) jobRefresh(true);
    } catch (e) { fail(e); }
  }

  async function setPriority(id, value) {
    const n = Number(value);
    if (!Number.isInteger(n)) return showMessage('A priority is a whole number from -100 to 100.');
    try {
      const st = await apiJSON(`/v1/jobs/${encodeURIComponent(id)}/priority`, {
        method: 'PUT', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ priority: n }) });
      delete st.frames;
      jobs.set(id, st);
      showMessage('');
      if (route.name === 'jobs') renderJobs();
      if (jobRefresh) jobRefresh(true);
    } catch (e) { fail(e); }
  }

  // heatColour is a cool-to-hot colour of f in [0, 1]: blue for the fastest, red for the slowest.
  const heatColour = (f) => `hsl(${Math.round(220 * (1 - f))}, 85%, ${Math.round(62 - 17 * f)}%)`;

  // A thumbnail's size for a frame of w x h, as the coordinator scales it (ThumbnailOf): the
  // smallest whole factor that fits 160 px.
  function thumbSize(w, h) {
    const k = Math.max(1, Math.ceil(Math.max(w, h) / 160));
    return { w: Math.ceil(w / k), h: Math.ceil(h / k) };
  }

  // The colours a frame or tile state is drawn in where text cannot say it (a canvas); the text
  // beside it always does.
  const stateColour = { queued: '#e8ecf0', rendering: '#fff2c4', assembling: '#dbe9ff', completed: '#d3f2dc', failed: '#ffd9d6', waiting: '#eee6ff', blocked: '#ffe1c2' };

  // One job: its numbers, its render time per frame as a chart, and its frames as a contact
  // sheet: the finished ones as thumbnails, filling in as they complete, the others drawn as
  // queued or rendering with their progress.
  async function jobView(r) {
    const path = `/v1/jobs/${encodeURIComponent(r.id)}`;
    const head = el('div', { id: 'job-head' });
    const chart = el('canvas', { id: 'frame-times', width: 960, height: 96, role: 'img', 'aria-label': 'Render time per frame' });
    const chartNote = el('p', { id: 'frame-times-summary', class: 'muted' });
    const sheet = el('ul', { class: 'sheet', id: 'frames', 'aria-label': 'Frames', 'data-thumbnails-drawn': 0 });
    const movie = el('section', { id: 'movie', 'aria-label': 'Preview movie' });
    view.replaceChildren(el('p', {}, el('a', { href: '#/' }, '← Jobs')), head, movie,
      el('h3', {}, 'Render time per frame'), el('div', { class: 'chart' }, chart), chartNote, el('h3', {}, 'Frames'), sheet);
    const js = { cards: new Map(), size: null, drawn: 0, queue: [], loading: 0, frames: [], frameEvent: () => {} };
    const gone = () => route.name !== 'job' || route.id !== r.id || jobState !== js;
    jobState = js;
    // Thumbnails are fetched only for cards on screen, two at a time: a shot of hundreds of
    // finished frames costs what the window shows.
    const observer = new IntersectionObserver((entries) => {
      for (const e of entries) {
        const c = js.cards.get(Number(e.target.dataset.frame));
        if (c && e.isIntersecting && !c.visible) {
          c.visible = true;
          want(c);
        }
      }
    }, { rootMargin: '200px' });
    js.observer = observer;

    function want(c) {
      if (c.visible && c.state === 'completed' && !c.drawn && !c.queued) {
        c.queued = true;
        js.queue.push(c);
        pump();
      }
    }
    function pump() {
      while (js.loading < 2 && js.queue.length && !gone()) {
        const c = js.queue.shift();
        js.loading++;
        loadThumb(c).catch((e) => { c.queued = false; fail(e); }).finally(() => { js.loading--; pump(); });
      }
    }
    async function loadThumb(c) {
      const res = await api(`${path}/frames/${c.frame}/thumbnail`);
      if (!res.ok) throw new Error(`thumbnail of frame ${c.frame}: ${res.status}`);
      const bmp = await createImageBitmap(await res.blob(), { colorSpaceConversion: 'none', premultiplyAlpha: 'none' });
      if (gone()) return;
      c.canvas.width = bmp.width;
      c.canvas.height = bmp.height;
      c.canvas.getContext('2d', { colorSpace: 'srgb' }).drawImage(bmp, 0, 0);
      bmp.close();
      c.drawn = true;
      c.canvas.dataset.drawn = '1';
      js.drawn++;
      sheet.dataset.thumbnailsDrawn = String(js.drawn);
    }

    // A frame not finished: its state's colour, its progress as a bar, and its state in words.
    function placeholder(c, f) {
      const ctx = c.canvas.getContext('2d');
      const { width: w, height: h } = c.canvas;
      ctx.fillStyle = stateColour[f.state] || stateColour.queued;
      ctx.fillRect(0, 0, w, h);
      const done = f.samples_total > 0 ? f.samples_done / f.samples_total : 0;
      ctx.fillStyle = '#0b5cad';
      ctx.fillRect(0, h - 6, Math.round(w * done), 6);
      ctx.fillStyle = '#1b1f24';
      ctx.font = '12px system-ui, sans-serif';
      ctx.textAlign = 'center';
      ctx.fillText(f.state === 'rendering' ? `rendering ${pct(f.samples_done, f.samples_total)}` : f.state, w / 2, h / 2);
    }

    function card(f) {
      const { w, h } = js.size;
      const canvas = el('canvas', { class: 'thumb', width: w, height: h, role: 'img', 'aria-label': `Frame ${f.frame}` });
      const label = el('span', { class: 'label' });
      const bar = el('span', { class: 'bar', role: 'presentation' }, el('span'));
      const li = el('li', { 'data-frame': f.frame },
        el('a', { href: `#/jobs/${encodeURIComponent(r.id)}/frames/${f.frame}` }, canvas, label, bar));
      const c = { frame: f.frame, li, canvas, label, bar, state: null, key: '', drawn: false, visible: false, queued: false };
      js.cards.set(f.frame, c);
      observer.observe(li);
      return c;
    }

    function update(c, f) {
      c.li.dataset.state = f.state;
      c.label.replaceChildren(...[el('strong', {}, 'Frame ' + f.frame), ' ', badge(f.state), el('br'),
        `tiles ${f.tiles_completed}/${f.tiles_total}` + (f.tiles_failed ? `, ${f.tiles_failed} failed` : '') +
        (f.render_seconds ? `, ${f.render_seconds.toFixed(1)} s` : ''),
        f.error ? el('span', { class: 'error' }, el('br'), f.error) : null].filter(Boolean));
      c.bar.firstChild.style.width = pct(f.samples_done, f.samples_total).replace('–', '0');
      c.state = f.state;
      const key = `${f.state}/${f.samples_done}`;
      if (!c.drawn && key !== c.key) placeholder(c, f);
      c.key = key;
      want(c);
    }

    // Render time per frame: one bar a frame, the slowest marked, so a spike shows at a glance.
    function drawChart(frames) {
      const ctx = chart.getContext('2d');
      const W = chart.width, H = chart.height, n = frames.length;
      ctx.clearRect(0, 0, W, H);
      const times = frames.map((f) => f.render_seconds || 0);
      const timed = times.filter((t) => t > 0);
      const max = Math.max(0, ...times);
      let slowest = -1;
      times.forEach((t, i) => { if (t > 0 && (slowest < 0 || t > times[slowest])) slowest = i; });
      const bw = W / Math.max(n, 1);
      frames.forEach((f, i) => {
        const t = times[i];
        const bh = max > 0 ? Math.max(1, Math.round(((H - 14) * t) / max)) : 0;
        ctx.fillStyle = i === slowest ? '#c2410c' : t > 0 ? '#0b5cad' : '#d6dbe1';
        ctx.fillRect(Math.floor(i * bw) + (bw > 3 ? 1 : 0), H - (t > 0 ? bh : 2), Math.max(1, Math.floor(bw) - (bw > 3 ? 1 : 0)), t > 0 ? bh : 2);
      });
      chart.dataset.framesTimed = String(timed.length);
      if (slowest < 0) {
        delete chart.dataset.slowestFrame;
        chartNote.textContent = 'No frame has reported render times yet.';
        chart.setAttribute('aria-label', 'Render time per frame: none reported yet');
        return;
      }
      const sorted = [...timed].sort((a, b) => a - b);
      const median = sorted[Math.floor(sorted.length / 2)];
      const f = frames[slowest];
      chart.dataset.slowestFrame = String(f.frame);
      const text = `Slowest: frame ${f.frame}, ${times[slowest].toFixed(1)} s of rendering (median ${median.toFixed(1)} s over ${timed.length} frames with times). Click a bar to open its frame.`;
      chartNote.textContent = text;
      chart.setAttribute('aria-label', 'Render time per frame. ' + text);
    }
    chart.addEventListener('click', (ev) => {
      const rect = chart.getBoundingClientRect();
      const i = Math.floor(((ev.clientX - rect.left) / rect.width) * js.frames.length);
      const f = js.frames[i];
      if (f) location.hash = `#/jobs/${encodeURIComponent(r.id)}/frames/${f.frame}`;
    });

    const draw = (st) => {
      head.replaceChildren(...[
        el('h2', {}, 'Job ', st.job_id, ' ', badge(st.state)),
        el('p', {}, `Scene ${st.scene}, camera ${st.camera || 'default'}, frames ${st.first_frame}-${st.last_frame}${st.frame_step > 1 ? ', every ' + st.frame_step : ''}, formats ${st.formats.join(', ')}`),
        st.preview_frames ? el('p', { id: 'preview' }, `Preview frames ${st.preview_frames.join(', ')}: `, badge(st.preview_done ? 'completed' : 'rendering')) : null,
        st.pool && st.pool !== 'any worker' ? el('p', { id: 'pool' }, `Renders on ${st.pool}`) : null,
        st.waiting_for ? el('p', { id: 'waiting', class: 'error' }, `Waiting for ${st.waiting_for}`) : null,
        st.blocked_reason ? el('p', { id: 'blocked', class: 'error' }, `Blocked: ${st.blocked_reason}`) : null,
        st.after || st.after_frames ? el('p', { id: 'after' }, 'After ' + [st.after ? st.after.join(', ') + ' completed' : '',
          st.after_frames ? 'frame by frame ' + st.after_frames : ''].filter(Boolean).join('; ')) : null,
        el('p', {}, `Frames ${st.frames_completed}/${st.frames_total}, tiles ${st.tiles_completed}/${st.tiles_total}, samples ${pct(st.samples_done, st.samples_total)}, ETA ${st.eta_seconds != null ? duration(st.eta_seconds) : '–'}, priority ${st.priority}, age ${age(st.created)}`),
        jobActions(st),
        st.failures && st.failures.length ? el('ul', { class: 'error' }, st.failures.map((f) => el('li', {}, f))) : null].filter(Boolean));
      $('[data-action=cancel]', head).disabled = terminal(st.state);
      js.frames = st.frames;
      if (!sheet.childElementCount) sheet.append(...st.frames.map((f) => card(f).li));
      for (const f of st.frames) {
        const c = js.cards.get(f.frame);
        if (c) update(c, f);
      }
      drawChart(st.frames);

      showMovie(movie, st).catch(fail);
    };
    let busy = false, again = false;
    const refresh = async () => {
      if (busy) { again = true; return; }
      busy = true;
      try {
        do {
          again = false;
          const st = await apiJSON(path);
          if (gone()) return;
          if (!js.size) {
            // The frames' size, for the sheet's cards: the first frame's tiles say it.
            const ft = await apiJSON(`${path}/frames/${st.frames[0].frame}/tiles`);
            if (gone()) return;
            js.size = thumbSize(ft.width, ft.height);
          }
          draw(st);
        } while (again);
      } catch (e) { fail(e); } finally { busy = false; }
    };
    // The sheet follows the stream's frame events at once (a frame's state and tiles); the
    // job's status, 240 frames of it for a long shot, is fetched at most every
    // jobRefreshEvery, so a page open on a busy job costs the coordinator little.
    js.frameEvent = (ev) => {
      const f = js.frames.find((x) => x.frame === ev.frame);
      const c = js.cards.get(ev.frame);
      if (!f || !c) return;
      Object.assign(f, { state: ev.state, tiles_completed: ev.tiles_completed, tiles_failed: ev.tiles_failed });
      update(c, f);
    };
    let last = 0, timer = null;
    jobRefresh = (now) => {
      const wait = last + jobRefreshEvery - Date.now();
      if (now || wait <= 0) {
        last = Date.now();
        refresh();
      } else if (timer == null) {
        timer = setTimeout(() => { timer = null; last = Date.now(); refresh(); }, wait);
        viewTimers.push(timer);
      }
    };
    last = Date.now();
    await refresh();
  }

  // The job's preview movie (docs/web.md): once ready, a video of it, fetched with the token
  // and made once, so a refresh never restarts it; before, what it waits for or why it failed.
  async function showMovie(box, st) {
    const m = st.movie || { state: 'pending' };
    if (box.dataset.state === 'ready' || (box.dataset.state === m.state && box.dataset.reason === (m.reason || ''))) return;
    box.dataset.state = m.state;
    box.dataset.reason = m.reason || '';
    if (m.state !== 'ready') {
      const text = m.state === 'skipped' ? `No movie: ${m.reason}` : `Movie ${m.state}: ${m.reason}`;
      box.replaceChildren(el('p', { class: m.state === 'failed' ? 'error' : 'muted', 'data-movie': m.state }, text));
      return;
    }
    let blob;
    try {
      const res = await api(m.url);
      if (!res.ok) throw new Error(`movie: ${res.status}`);
      blob = await res.blob();
    } catch (e) {
      box.dataset.state = ''; // the next refresh tries again
      throw e;
    }
    if (route.name !== 'job' || route.id !== st.job_id) return;
    if (movieURL) URL.revokeObjectURL(movieURL);
    movieURL = URL.createObjectURL(blob);
    const name = `${st.job_id}.webm`;
    const video = el('video', { controls: true, preload: 'metadata', src: movieURL, 'aria-label': `Preview movie of ${st.job_id}` });
    // Shown as the frame's canvas is (up to 4x, or 960 px wide), and wide enough for its controls.
    video.addEventListener('loadedmetadata', () => {
      const w = video.videoWidth;
      if (w > 0) video.style.width = Math.max(320, Math.round(w * Math.max(1, Math.min(4, 960 / w)))) + 'px';
    });
    box.replaceChildren(el('h3', {}, 'Movie'), video,
      el('p', {}, el('a', { href: m.url, 'data-movie': 'ready', onclick: (ev) => { ev.preventDefault(); download(m.url, name); } }, 'Download ' + name)));
  }

  // One frame: a canvas its completed tiles are drawn onto, the tiles in progress outlined.
  async function frameView(r) {
    const base = `/v1/jobs/${encodeURIComponent(r.id)}`;
    const head = el('div', { id: 'frame-head' });
    const downloads = el('div', { class: 'downloads', id: 'downloads' });
    const note = el('p', { class: 'muted', id: 'frame-note' });
    const canvas = el('canvas', { id: 'frame-canvas', 'data-tiles-drawn': 0, role: 'img', 'aria-label': `Frame ${r.frame} of ${r.id}` });
    const overlay = el('div', { class: 'overlay', id: 'in-progress' });
    const heat = el('canvas', { id: 'heat-canvas', 'data-tiles-timed': 0, role: 'img', 'aria-label': 'Render time of each tile' });
    const legend = el('p', { id: 'heat-legend', class: 'muted' });
    const slowest = el('ol', { id: 'slowest', class: 'slowest' });
    const failedTiles = el('div', { id: 'failed-tiles' });
    view.replaceChildren(el('p', {}, el('a', { href: '#/jobs/' + encodeURIComponent(r.id) }, '← Job ' + r.id)), head, downloads, note,
      el('div', { class: 'stages' },
        el('figure', {}, el('div', { class: 'stage' }, canvas, overlay), el('figcaption', { class: 'muted' }, 'The frame')),
        el('figure', {}, el('div', { class: 'stage' }, heat), el('figcaption', { class: 'muted' }, 'Where the time goes: each tile coloured by its render time'))),
      legend, el('h3', {}, 'Slowest tiles'), slowest, failedTiles);
    const fs = { drawn: new Set(), tiles: null, ctx: null, busy: false, again: false, shownFrame: false };
    frameState = fs;
    const gone = () => frameState !== fs;

    async function drawTile(t) {
      const res = await api(`${base}/frames/${r.frame}/tiles/${t.index}/png`);
      if (!res.ok) throw new Error(`tile ${t.index}: ${res.status}`);
      const bmp = await createImageBitmap(await res.blob(), { colorSpaceConversion: 'none', premultiplyAlpha: 'none' });
      if (gone()) return;
      fs.ctx.drawImage(bmp, t.rect.x0, t.rect.y0);
      bmp.close();
      fs.drawn.add(t.index);
      canvas.dataset.tilesDrawn = String(fs.drawn.size);
    }

    async function showFinished(format) {
      const res = await api(`${base}/frames/${r.frame}/${format}`);
      if (!res.ok) throw new Error(`frame ${r.frame}: ${res.status}`);
      const bmp = await createImageBitmap(await res.blob(), { colorSpaceConversion: 'none', premultiplyAlpha: 'none' });
      if (gone()) return;
      fs.ctx.drawImage(bmp, 0, 0);
      bmp.close();
      fs.shownFrame = true;
      canvas.dataset.frameDrawn = '1';
    }

    async function outline() {
      const { workers } = await apiJSON('/v1/workers');
      if (gone() || !fs.tiles) return;
      const byKey = new Map(fs.tiles.tiles.map((t) => [t.tile_key, t]));
      const boxes = [];
      for (const w of workers) {
        for (const wt of w.tiles || []) {
          const t = byKey.get(wt.tile_key);
          if (wt.job_id !== r.id || wt.frame !== r.frame || !t || fs.drawn.has(t.index)) continue;
          const { width, height } = fs.tiles;
          const box = el('div', { 'data-tile': t.index }, `${w.name} ${wt.samples_done}/${wt.samples_total}`);
          box.style.left = (100 * t.rect.x0) / width + '%';
          box.style.top = (100 * t.rect.y0) / height + '%';
          box.style.width = (100 * (t.rect.x1 - t.rect.x0)) / width + '%';
          box.style.height = (100 * (t.rect.y1 - t.rect.y0)) / height + '%';
          box.title = `tile ${t.index} rendering on ${w.name}: ${wt.samples_done} of ${wt.samples_total} samples`;
          boxes.push(box);
        }
      }
      overlay.replaceChildren(...boxes);
    }

    // The heat map: each tile coloured by how long the attempt that completed it rendered it,
    // cool to hot relative to the frame's slowest; the slowest tiles listed.
    function drawHeat(ft) {
      const ctx = heat.getContext('2d');
      const timed = ft.tiles.filter((t) => t.render_ms > 0).sort((a, b) => b.render_ms - a.render_ms || a.index - b.index);
      const max = timed.length ? timed[0].render_ms : 0;
      const min = timed.length ? timed[timed.length - 1].render_ms : 0;
      ctx.clearRect(0, 0, heat.width, heat.height);
      for (const t of ft.tiles) {
        const { x0, y0, x1, y1 } = t.rect;
        ctx.fillStyle = t.render_ms > 0 ? heatColour(t.render_ms / max) : t.state === 'completed' ? '#b8bec6' : '#eef0f2';
        ctx.fillRect(x0, y0, x1 - x0, y1 - y0);
        ctx.strokeStyle = 'rgba(255,255,255,0.7)';
        ctx.strokeRect(x0 + 0.5, y0 + 0.5, x1 - x0 - 1, y1 - y0 - 1);
      }
      heat.dataset.tilesTimed = String(timed.length);
      const rect = (t) => `(${t.rect.x0},${t.rect.y0})–(${t.rect.x1},${t.rect.y1})`;
      if (!timed.length) {
        delete heat.dataset.hottest;
        legend.textContent = 'No tile has reported its render time yet.';
        slowest.replaceChildren();
        return;
      }
      heat.dataset.hottest = String(timed[0].index);
      legend.replaceChildren(el('span', { class: 'ramp', role: 'presentation' }),
        ` cool ${(min / 1000).toFixed(2)} s to hot ${(max / 1000).toFixed(2)} s a tile; ${timed.length} of ${ft.tiles.length} tiles timed (grey: not completed, or completed without a time).`);
      heat.setAttribute('aria-label', `Render time of each tile: the slowest, tile ${timed[0].index} ${rect(timed[0])}, took ${(max / 1000).toFixed(2)} s`);
      slowest.replaceChildren(...timed.slice(0, 5).map((t) => el('li', { 'data-tile': t.index },
        `tile ${t.index} ${rect(t)}: ${(t.render_ms / 1000).toFixed(2)} s`)));
    }

    // The tiles with failed attempts, each opening its attempts.
    function drawFailed(ft) {
      const failed = ft.tiles.filter((t) => t.failures > 0);
      failedTiles.replaceChildren(...(failed.length ? [el('h3', {}, 'Tiles with failed attempts'),
        el('ul', {}, failed.map((t) => el('li', { 'data-tile': t.index },
          el('a', { href: `#/jobs/${encodeURIComponent(r.id)}/frames/${r.frame}/tiles/${t.index}` }, `tile ${t.index}`),
          ` (${t.rect.x0},${t.rect.y0})–(${t.rect.x1},${t.rect.y1}): ${t.failures} failed attempt${t.failures > 1 ? 's' : ''} recorded, now `,
          badge(t.state))))] : []));
    }

    async function refreshOnce() {
      const [st, ft] = await Promise.all([apiJSON(base), apiJSON(`${base}/frames/${r.frame}/tiles`)]);
      if (gone()) return;
      fs.tiles = ft;
      if (!fs.ctx) {
        canvas.width = ft.width;
        canvas.height = ft.height;
        // Shown up to 4x, or as wide as 560 px, the heat map beside it at the same scale: the
        // pixels drawn stay the frame's own.
        canvas.style.width = Math.round(ft.width * Math.max(1, Math.min(4, 560 / ft.width))) + 'px';
        heat.width = ft.width;
        heat.height = ft.height;
        heat.style.width = canvas.style.width;
        fs.ctx = canvas.getContext('2d', { colorSpace: 'srgb' });
      }
      drawHeat(ft);
      drawFailed(ft);
      const fr = (st.frames || []).find((f) => f.frame === r.frame) || { state: ft.state, tiles_completed: 0, tiles_total: ft.tiles.length };
      const done = ft.tiles.filter((t) => t.state === 'completed').length;
      head.replaceChildren(...[el('h2', {}, `Frame ${r.frame} `, badge(fr.state)),
        el('p', {}, `Tiles ${done}/${ft.tiles.length} completed, ${ft.width}x${ft.height} px, samples ${pct(fr.samples_done, fr.samples_total)}`),
        fr.error ? el('p', { class: 'error' }, fr.error) : null].filter(Boolean));
      if (fr.state === 'completed' && !downloads.childElementCount) {
        const link = (href, name, label, format) => el('a', { href, 'data-format': format, onclick: (ev) => { ev.preventDefault(); download(href, name); } }, label);
        const links = [];
        for (const format of st.formats) {
          const href = `${base}/frames/${r.frame}/${format}`;
          if (format !== 'blend') {
            links.push(link(href, `frame_${String(r.frame).padStart(4, '0')}.${format.replace('16', '')}`, format, format));
            continue;
          }
          // The .blend's own output: named as Blender names it, with its File Output nodes' files.
          const index = await apiJSON(`${href}/index`);
          if (gone()) return;
          const base_ = (p) => p.split('/').pop();
          links.push(link(href, base_(index.name), base_(index.name), format));
          (index.files || []).forEach((f, i) => links.push(link(`${href}?file=${i}`, base_(f), f, format)));
        }
        downloads.append(el('span', {}, 'Download:'), ...links);
      }
      if (ft.tile_png) {
        note.textContent = '';
        for (const t of ft.tiles) {
          if (t.state === 'completed' && !fs.drawn.has(t.index)) {
            await drawTile(t);
            if (gone()) return;
          }
        }
      } else {
        note.textContent = "A Blender scene: its compositor and colour management run on the whole frame, so its Composite is shown once it is finished.";
        if (fr.state === 'completed' && !fs.shownFrame && st.formats.includes('png')) await showFinished('png');
      }
      await outline();
    }

    fs.refresh = async () => {
      if (fs.busy) { fs.again = true; return; }
      fs.busy = true;
      try {
        do {
          fs.again = false;
          await refreshOnce();
        } while (fs.again && !gone());
      } catch (e) { fail(e); } finally { fs.busy = false; }
    };
    await fs.refresh();
    every(1500, () => { if (!fs.busy && fs.tiles && fs.drawn.size < fs.tiles.tiles.length) outline().catch(fail); });
  }

  async function download(path, name) {
    try {
      const res = await api(path);
      if (!res.ok) throw new Error(`${name}: ${res.status}`);
      const url = URL.createObjectURL(await res.blob());
      const a = el('a', { href: url, download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) { fail(e); }
  }

  // Workers: each worker's slots busy over the last minutes (one sample a heartbeat), what it
  // renders now, its pools and tags, and its recent failures.
  // sparkSpan is the time a sparkline spans: the history's (a coordinator keeps 10 minutes), at
  // least a minute.
  const sparkSpan = (w) => {
    const hist = w.history || [];
    const first = hist.length ? Date.parse(hist[0].time) : Date.now();
    return Math.min(600e3, Math.max(60e3, Date.now() - first + 5e3));
  };

  function sparkline(w) {
    const hist = w.history || [];
    const W = 150, H = 32, span = sparkSpan(w), slots = Math.max(1, w.slots);
    const c = el('canvas', { class: 'spark', width: W, height: H, 'data-samples': hist.length, role: 'img' });
    const ctx = c.getContext('2d');
    ctx.fillStyle = '#f3f5f7';
    ctx.fillRect(0, 0, W, H);
    const now = Date.now();
    const pts = hist.map((s) => [Math.max(0, Math.min(W, (W * (Date.parse(s.time) - (now - span))) / span)), H - 1 - ((H - 2) * Math.min(s.busy, slots)) / slots]);
    if (pts.length) {
      ctx.beginPath();
      ctx.moveTo(pts[0][0], H);
      for (const [x, y] of pts) ctx.lineTo(x, y);
      ctx.lineTo(pts[pts.length - 1][0], H);
      ctx.closePath();
      ctx.fillStyle = 'rgba(11, 92, 173, 0.25)';
      ctx.fill();
      ctx.beginPath();
      pts.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
      ctx.strokeStyle = '#0b5cad';
      ctx.lineWidth = 1.5;
      ctx.stroke();
    }
    const busy = hist.map((s) => s.busy);
    c.setAttribute('aria-label', hist.length
      ? `Slots busy over the last ${duration(span / 1000)}, ${hist.length} heartbeats: from ${Math.min(...busy).toFixed(1)} to ${Math.max(...busy).toFixed(1)} of ${w.slots}`
      : 'No heartbeat sampled yet');
    return c;
  }

  async function workersView() {
    const table = el('table', { id: 'workers' },
      el('thead', {}, el('tr', {}, el('th', { scope: 'col' }, 'Worker'), el('th', { scope: 'col' }, 'Slots busy'),
        el('th', { scope: 'col' }, 'Rendering now'), el('th', { scope: 'col' }, 'Pools and tags'), el('th', { scope: 'col' }, 'Recent failures'),
        el('th', { scope: 'col', class: 'hide-narrow' }, 'Samples/s'), el('th', { scope: 'col', class: 'hide-narrow' }, 'Last seen'),
        el('th', { scope: 'col', class: 'hide-narrow' }, 'Blocklisted jobs'))),
      el('tbody', {}));
    const leader = el('p', { id: 'leader', class: 'muted' });
    view.replaceChildren(el('h2', {}, 'Workers'), leader, el('div', { class: 'scroll' }, table));
    const frameLink = (job, frame, text) => el('a', { href: `#/jobs/${encodeURIComponent(job)}/frames/${frame}` }, text);
    const refresh = async () => {
      const { workers, leader: lead } = await apiJSON('/v1/workers?detail=1');
      if (route.name !== 'workers') return;
      // The farm's leadership lease (docs/design.md, "Leadership"): who leads, and whether it is this coordinator.
      leader.dataset.this = lead && lead.this ? '1' : '0';
      leader.textContent = !lead ? 'No coordinator holds the farm\'s leadership.'
        : lead.this ? `This coordinator leads the farm${lead.address ? ' (' + lead.address + ')' : ''}.`
          : `The farm is led by the coordinator at ${lead.address || lead.id}: this one does not lead.`;
      $('tbody', table).replaceChildren(...(workers.length ? workers.map((w) => el('tr', { 'data-worker': w.name },
        el('td', {}, el('strong', {}, w.name), el('br'), el('span', { class: 'muted' }, w.host)),
        el('td', { 'data-col': 'slots' }, sparkline(w),
          el('span', { class: 'busy' }, `${Math.min(w.busy_slots || 0, w.slots).toFixed(1)} of ${w.slots} slots busy`),
          el('span', { class: 'muted' }, ` now; the last ${duration(sparkSpan(w) / 1000)} above`)),
        el('td', {}, (w.tiles || []).length ? el('ul', {}, w.tiles.map((t) => el('li', {},
          frameLink(t.job_id, t.frame, `${t.job_id} frame ${t.frame}`),
          ` tile ${t.tile_key.slice(0, 8)} ${t.samples_done}/${t.samples_total}`))) : el('span', { class: 'muted' }, 'idle')),
        el('td', { 'data-col': 'pools' }, el('ul', { class: 'plain' }, (w.pools || ['any worker']).map((p) => el('li', {}, p))),
          el('span', { class: 'muted' }, (w.tags || []).length ? 'tags ' + w.tags.join(', ') : 'no tags'),
          ...(w.builds || []).map((b) => [el('br'), el('code', {}, b)])),
        el('td', { 'data-col': 'failures' }, (w.recent_failures || []).length ? el('ul', {}, w.recent_failures.slice().reverse().map((f) => el('li', {},
          el('a', { href: `#/jobs/${encodeURIComponent(f.job_id)}/frames/${f.frame}/tiles/${f.tile}` }, `frame ${f.frame} tile ${f.tile}`), ' ',
          badge(f.class), f.dead_lettered ? [' ', badge('dead_lettered')] : null, ' ', el('span', { class: 'muted' }, age(f.time) + ' ago'),
          el('br'), el('span', { class: 'error' }, f.error.length > 120 ? f.error.slice(0, 120) + '…' : f.error)))) : el('span', { class: 'muted' }, 'none')),
        el('td', { class: 'hide-narrow' }, w.samples_per_second.toFixed(1)), el('td', { class: 'hide-narrow' }, age(w.last_seen) + ' ago'),
        el('td', { class: 'hide-narrow' }, (w.blocklisted_jobs || []).join(', ') || '–')))
        : [el('tr', {}, el('td', { colspan: 8, class: 'muted' }, 'No live workers.'))]));
    };
    await refresh();
    every(2000, () => refresh().catch(fail));
  }

  // A failed attempt's story: its worker, class, error and the last lines its worker logged,
  // its renderer's output among them.
  function attemptsList(failures) {
    if (!failures.length) return el('p', { class: 'muted', id: 'attempts' }, 'No failed attempt recorded yet.');
    return el('ol', { class: 'attempts', id: 'attempts' }, failures.map((f, i) => el('li', { 'data-class': f.class, 'data-dead-lettered': f.dead_lettered ? '1' : null },
      el('p', {}, el('strong', {}, `Attempt ${i + 1}`), ` on ${f.worker || 'an unknown worker'}`, f.delivery ? `, delivery ${f.delivery}` : '',
        `, ${new Date(f.time).toLocaleString()} `, badge(f.class), f.dead_lettered ? [' ', badge('dead_lettered')] : null),
      el('p', { class: 'error' }, f.error),
      f.log.length ? el('details', { open: true }, el('summary', {}, `The worker's last ${f.log.length} log lines of this attempt`),
        el('pre', { class: 'log' }, f.log.join('\n'))) : el('p', { class: 'muted' }, 'No log lines recorded.'))));
  }

  // One tile's failed attempts.
  async function tileView(r) {
    const path = `/v1/jobs/${encodeURIComponent(r.id)}/frames/${r.frame}/tiles/${r.index}/failures`;
    const head = el('div', { id: 'tile-head' });
    const body = el('div', { id: 'tile-attempts' });
    view.replaceChildren(el('p', {}, el('a', { href: `#/jobs/${encodeURIComponent(r.id)}/frames/${r.frame}` }, `← Frame ${r.frame} of ${r.id}`)),
      head, el('h3', {}, 'Failed attempts'), body);
    let shown = null;
    const refresh = async () => {
      const tf = await apiJSON(path);
      if (route.name !== 'tile' || route.id !== r.id || route.frame !== r.frame || route.index !== r.index) return;
      const key = JSON.stringify(tf);
      if (key === shown) return;
      shown = key;
      head.replaceChildren(el('h2', {}, `Tile ${tf.index} of frame ${tf.frame} `, badge(tf.state)),
        el('p', {}, `(${tf.rect.x0},${tf.rect.y0})–(${tf.rect.x1},${tf.rect.y1}), tile key `, el('code', {}, tf.tile_key.slice(0, 16))));
      body.replaceChildren(attemptsList(tf.failures));
    };
    viewRefresh = () => refresh().catch(fail);
    await refresh();
  }

  // Dead letters.
  async function dlqView() {
    const table = el('table', { id: 'dlq' },
      el('thead', {}, el('tr', {}, el('th', { scope: 'col' }, 'Seq'), el('th', { scope: 'col' }, 'Subject'),
        el('th', { scope: 'col' }, 'Deliveries'), el('th', { scope: 'col' }, 'Reason'), el('th', { scope: 'col', class: 'hide-narrow' }, 'Time'),
        el('th', { scope: 'col' }, 'Action'))),
      el('tbody', {}));
    view.replaceChildren(el('h2', {}, 'Dead letters'), el('div', { class: 'scroll' }, table));
    let shown = null;
    const refresh = async () => {
      const dls = await apiJSON('/v1/dlq');
      if (route.name !== 'dlq') return;
      // Drawn again only when it changed, so a link or button keeps its focus.
      const key = JSON.stringify(dls.map((d) => [d.dlq_seq, d.deliveries, d.reason]));
      if (key === shown) return;
      shown = key;
      $('tbody', table).replaceChildren(...(dls.length ? dls.map((d) => el('tr', { 'data-seq': d.dlq_seq },
        el('td', {}, el('a', { href: `#/dlq/${d.dlq_seq}`, 'aria-label': 'Dead letter ' + d.dlq_seq + ': its attempts' }, d.dlq_seq)),
        el('td', {}, el('code', {}, d.subject)), el('td', {}, d.deliveries), el('td', {}, d.reason),
        el('td', { class: 'hide-narrow' }, d.time ? new Date(d.time).toLocaleString() : '–'),
        el('td', {}, el('button', { type: 'button', 'data-action': 'requeue', 'data-seq': d.dlq_seq, 'aria-label': 'Requeue dead letter ' + d.dlq_seq,
          onclick: (ev) => requeue(d.dlq_seq, ev.target) }, 'Requeue'))))
        : [el('tr', {}, el('td', { colspan: 6, class: 'muted' }, 'No dead letters.'))]));
    };
    viewRefresh = () => refresh().catch(fail);
    await refresh();
    every(3000, viewRefresh);
  }

  // One dead letter: what it held, why, and its tile's failed attempts with their logs.
  async function deadLetterView(r) {
    const head = el('div', { id: 'dl-head' });
    const body = el('div', { id: 'dl-attempts' });
    view.replaceChildren(el('p', {}, el('a', { href: '#/dlq' }, '← Dead letters')), head, el('h3', {}, 'Attempts'), body);
    let shown = null;
    const refresh = async () => {
      const d = await apiJSON(`/v1/dlq/${r.seq}`);
      if (route.name !== 'deadLetter' || route.seq !== r.seq) return;
      const key = JSON.stringify(d); // drawn again only when it changed, as the list is
      if (key === shown) return;
      shown = key;
      const job = d.job_id ? encodeURIComponent(d.job_id) : '';
      const what = d.kind === 'tile' ? ['tile ', el('a', { href: `#/jobs/${job}/frames/${d.frame}/tiles/${d.tile_index}` }, String(d.tile_index)),
        ' of ', el('a', { href: `#/jobs/${job}/frames/${d.frame}` }, `frame ${d.frame}`), ' of job ', el('a', { href: `#/jobs/${job}` }, d.job_id)]
        : d.kind === 'assembly' ? ['the assembly of ', el('a', { href: `#/jobs/${job}/frames/${d.frame}` }, `frame ${d.frame}`), ' of job ', el('a', { href: `#/jobs/${job}` }, d.job_id)]
          : ['a message the farm cannot read'];
      head.replaceChildren(el('h2', {}, `Dead letter ${d.dlq_seq}`),
        el('p', {}, 'Held ', ...what, `; delivered ${d.deliveries} times; dead-lettered ${d.time ? new Date(d.time).toLocaleString() : '–'}.`),
        el('p', {}, 'Subject ', el('code', {}, d.subject)),
        el('p', { class: 'error', id: 'dl-reason' }, d.reason),
        el('p', {}, el('button', { type: 'button', 'data-action': 'requeue', 'aria-label': 'Requeue dead letter ' + d.dlq_seq,
          onclick: async (ev) => { if (await requeue(d.dlq_seq, ev.target)) location.hash = '#/dlq'; } }, 'Requeue')));
      body.replaceChildren(d.kind === 'assembly' ? el('p', { class: 'muted', id: 'attempts' }, 'An assembly keeps no attempts of its own: its reason above is its last error.')
        : attemptsList(d.failures));
    };
    viewRefresh = () => refresh().catch(fail);
    await refresh();
    every(3000, viewRefresh);
  }

  async function requeue(seq, button) {
    button.disabled = true;
    try {
      await apiJSON(`/v1/dlq/${seq}/requeue`, { method: 'POST' });
      showMessage('');
      if (route.name === 'dlq') viewRefresh();
      return true;
    } catch (e) {
      button.disabled = false;
      fail(e);
      return false;
    }
  }

  const views = { jobs: jobsView, job: jobView, frame: frameView, tile: tileView, workers: workersView, dlq: dlqView, deadLetter: deadLetterView };

  // start asks the API once; a 401 brings up the token prompt, anything else shows the views.
  async function start() {
    try {
      await apiJSON('/v1/jobs');
    } catch (e) {
      fail(e);
      if (e instanceof Unauthorized) return;
    }
    authed = true;
    $('#token-form').hidden = true;
    startStream();
    render();
  }

  window.addEventListener('hashchange', render);
  route = parseRoute();
  start();
})();

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
  let jobRefresh = null; // the job view's refresh, called on events about its job
  let movieURL = null; // the object URL the job view's movie plays, revoked when the view changes

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
      if (route.name === 'dlq') dlqRefresh();
    } else if (event === 'frame') {
      for (const f of payload) {
        if (route.name === 'frame' && f.job_id === route.id && f.frame === route.frame && frameState) frameState.refresh();
        if (route.name === 'job' && f.job_id === route.id && jobRefresh) jobRefresh();
      }
    }
  }

  // Routing.
  function parseRoute() {
    const h = location.hash.replace(/^#/, '') || '/';
    let m;
    if ((m = h.match(/^\/jobs\/([^/]+)\/frames\/(-?\d+)$/))) return { name: 'frame', id: decodeURIComponent(m[1]), frame: Number(m[2]) };
    if ((m = h.match(/^\/jobs\/([^/]+)$/))) return { name: 'job', id: decodeURIComponent(m[1]) };
    if (h === '/workers') return { name: 'workers' };
    if (h === '/dlq') return { name: 'dlq' };
    return { name: 'jobs' };
  }

  function stopView() {
    if (movieURL) URL.revokeObjectURL(movieURL);
    movieURL = null;
    for (const t of viewTimers) clearInterval(t);
    viewTimers = [];
    frameState = null;
    jobRefresh = null;
  }
  const every = (ms, fn) => viewTimers.push(setInterval(fn, ms));

  async function render() {
    stopView();
    route = parseRoute();
    for (const [id, name] of [['nav-jobs', 'jobs'], ['nav-workers', 'workers'], ['nav-dlq', 'dlq']]) {
      if (route.name === name || (name === 'jobs' && (route.name === 'job' || route.name === 'frame'))) $('#' + id).setAttribute('aria-current', 'page');
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
    const list = await apiJSON('/v1/jobs');
    for (const st of list) jobs.set(st.job_id, st);
    const table = el('table', { id: 'jobs' },
      el('caption', { class: 'muted' }, 'Every job, newest first'),
      el('thead', {}, el('tr', {},
        el('th', { scope: 'col' }, 'Job'), el('th', { scope: 'col' }, 'State'), el('th', { scope: 'col' }, 'Frames'),
        el('th', { scope: 'col', class: 'hide-narrow' }, 'Tiles'), el('th', { scope: 'col' }, 'Samples'),
        el('th', { scope: 'col' }, 'ETA'), el('th', { scope: 'col' }, 'Priority'), el('th', { scope: 'col', class: 'hide-narrow' }, 'Age'),
        el('th', { scope: 'col' }, 'Actions'))),
      el('tbody', {}));
    view.replaceChildren(el('h2', {}, 'Jobs'), el('div', { class: 'scroll' }, table));
    renderJobs();
    every(1000, () => {
      for (const [id, tr] of jobRows) {
        const st = jobs.get(id);
        if (st) $('[data-col=age]', tr).textContent = age(st.created);
      }
    });
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
      if (jobRefresh) jobRefresh();
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
      if (jobRefresh) jobRefresh();
    } catch (e) { fail(e); }
  }

  // One job: its numbers and its frames as a grid.
  async function jobView(r) {
    const path = `/v1/jobs/${encodeURIComponent(r.id)}`;
    const head = el('div', { id: 'job-head' });
    const grid = el('ul', { class: 'frames', id: 'frames', 'aria-label': 'Frames' });
    const movie = el('section', { id: 'movie', 'aria-label': 'Preview movie' });
    view.replaceChildren(el('p', {}, el('a', { href: '#/' }, '← Jobs')), head, movie, el('h3', {}, 'Frames'), grid);
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
      grid.replaceChildren(...st.frames.map((f) => el('li', { 'data-frame': f.frame, 'data-state': f.state },
        el('a', { href: `#/jobs/${encodeURIComponent(st.job_id)}/frames/${f.frame}`, class: 's-' + f.state },
          el('strong', {}, 'Frame ' + f.frame), ' ', badge(f.state), el('br'),
          `tiles ${f.tiles_completed}/${f.tiles_total}` + (f.tiles_failed ? `, ${f.tiles_failed} failed` : ''),
          el('div', { class: 'bar', role: 'presentation' }, el('span', { style: null, 'data-w': pct(f.samples_done, f.samples_total) })),
          f.error ? el('div', { class: 'error' }, f.error) : null))));
      for (const s of grid.querySelectorAll('.bar span')) s.style.width = s.dataset.w === '–' ? '0' : s.dataset.w;

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
          if (route.name !== 'job' || route.id !== r.id) return;
          draw(st);
        } while (again);
      } catch (e) { fail(e); } finally { busy = false; }
    };
    jobRefresh = refresh;
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
    view.replaceChildren(el('p', {}, el('a', { href: '#/jobs/' + encodeURIComponent(r.id) }, '← Job ' + r.id)), head, downloads, note,
      el('div', { class: 'stage' }, canvas, overlay));
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

    async function refreshOnce() {
      const [st, ft] = await Promise.all([apiJSON(base), apiJSON(`${base}/frames/${r.frame}/tiles`)]);
      if (gone()) return;
      fs.tiles = ft;
      if (!fs.ctx) {
        canvas.width = ft.width;
        canvas.height = ft.height;
        // Shown up to 4x, or as wide as 960 px: the pixels drawn stay the frame's own.
        canvas.style.width = Math.round(ft.width * Math.max(1, Math.min(4, 960 / ft.width))) + 'px';
        fs.ctx = canvas.getContext('2d', { colorSpace: 'srgb' });
      }
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

  // Workers.
  async function workersView() {
    const table = el('table', { id: 'workers' },
      el('thead', {}, el('tr', {}, el('th', { scope: 'col' }, 'Worker'), el('th', { scope: 'col', class: 'hide-narrow' }, 'Host'),
        el('th', { scope: 'col' }, 'Slots'), el('th', { scope: 'col' }, 'Rendering'), el('th', { scope: 'col' }, 'Samples/s'),
        el('th', { scope: 'col', class: 'hide-narrow' }, 'Last seen'), el('th', { scope: 'col', class: 'hide-narrow' }, 'Blocklisted jobs'),
        el('th', { scope: 'col', class: 'hide-narrow' }, 'Pools'))),
      el('tbody', {}));
    view.replaceChildren(el('h2', {}, 'Workers'), el('div', { class: 'scroll' }, table));
    const refresh = async () => {
      const { workers } = await apiJSON('/v1/workers');
      if (route.name !== 'workers') return;
      $('tbody', table).replaceChildren(...(workers.length ? workers.map((w) => el('tr', { 'data-worker': w.name },
        el('td', {}, w.name), el('td', { class: 'hide-narrow' }, w.host), el('td', {}, w.slots),
        el('td', {}, (w.tiles || []).length ? el('ul', {}, w.tiles.map((t) => el('li', {},
          el('a', { href: `#/jobs/${encodeURIComponent(t.job_id)}/frames/${t.frame}` }, `${t.job_id} frame ${t.frame}`),
          ` tile ${t.tile_key.slice(0, 8)} ${t.samples_done}/${t.samples_total}`))) : el('span', { class: 'muted' }, 'idle')),
        el('td', {}, w.samples_per_second.toFixed(1)), el('td', { class: 'hide-narrow' }, age(w.last_seen) + ' ago'),
        el('td', { class: 'hide-narrow' }, (w.blocklisted_jobs || []).join(', ') || '–'),
        el('td', { class: 'hide-narrow' }, [(w.tags || []).length ? 'tags ' + w.tags.join(',') : 'no tags', ...(w.builds || [])].join('; '))))
        : [el('tr', {}, el('td', { colspan: 8, class: 'muted' }, 'No live workers.'))]));
    };
    await refresh();
    every(2000, () => refresh().catch(fail));
  }

  // Dead letters.
  let dlqRefresh = () => {};
  async function dlqView() {
    const table = el('table', { id: 'dlq' },
      el('thead', {}, el('tr', {}, el('th', { scope: 'col' }, 'Seq'), el('th', { scope: 'col' }, 'Subject'),
        el('th', { scope: 'col' }, 'Deliveries'), el('th', { scope: 'col' }, 'Reason'), el('th', { scope: 'col', class: 'hide-narrow' }, 'Time'),
        el('th', { scope: 'col' }, 'Action'))),
      el('tbody', {}));
    view.replaceChildren(el('h2', {}, 'Dead letters'), el('div', { class: 'scroll' }, table));
    const refresh = async () => {
      const dls = await apiJSON('/v1/dlq');
      if (route.name !== 'dlq') return;
      $('tbody', table).replaceChildren(...(dls.length ? dls.map((d) => el('tr', { 'data-seq': d.dlq_seq },
        el('td', {}, d.dlq_seq), el('td', {}, el('code', {}, d.subject)), el('td', {}, d.deliveries), el('td', {}, d.reason),
        el('td', { class: 'hide-narrow' }, d.time ? new Date(d.time).toLocaleString() : '–'),
        el('td', {}, el('button', { type: 'button', 'data-action': 'requeue', 'data-seq': d.dlq_seq, 'aria-label': 'Requeue dead letter ' + d.dlq_seq,
          onclick: (ev) => requeue(d.dlq_seq, ev.target) }, 'Requeue'))))
        : [el('tr', {}, el('td', { colspan: 6, class: 'muted' }, 'No dead letters.'))]));
    };
    dlqRefresh = () => refresh().catch(fail);
    await refresh();
    every(3000, dlqRefresh);
  }

  async function requeue(seq, button) {
    button.disabled = true;
    try {
      await apiJSON(`/v1/dlq/${seq}/requeue`, { method: 'POST' });
      showMessage('');
      dlqRefresh();
    } catch (e) {
      button.disabled = false;
      fail(e);
    }
  }

  const views = { jobs: jobsView, job: jobView, frame: frameView, workers: workersView, dlq: dlqView };

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

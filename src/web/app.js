// app.js: the chat page of `calla serve`. Plain JavaScript, no build step, no dependency.
//
// A reply streams from this server's own /v1/chat/completions (server-sent events); its thinking
// (reasoning_content) goes to a collapsible block, its answer (content) through renderMarkdown.
// Model output is never trusted as HTML: renderMarkdown escapes every character of the text first
// and only then adds its own few tags, and user messages go through the same function.
'use strict';

const $ = (id) => document.getElementById(id);
const state = {
  messages: [],                    // the conversation as sent: {role, content, reasoning_content?}
  key: sessionStorage.getItem('calla-key') || '',
  busy: null,                      // the running request's AbortController
};

// ---- Markdown, safely -----------------------------------------------------------------------

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
function escapeHtml(s) { return s.replace(/[&<>"']/g, (c) => ESC[c]); }

// Inline spans of one line: `code`, **bold**, *italic*, [text](http(s) URL). The text is escaped
// before any pattern is applied, so the only tags in the result are these.
function inline(text) {
  return text.split(/(`[^`\n]+`)/).map((part, k) => {
    if (k % 2) return '<code>' + escapeHtml(part.slice(1, -1)) + '</code>';
    return escapeHtml(part)
      .replace(/\*\*([^*]+)\*\*/g, '<strong>$1</strong>')
      .replace(/(^|[^*\w])\*([^*\s][^*]*)\*/g, '$1<em>$2</em>')
      .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
  }).join('');
}

// The Markdown subset a chat model writes: ``` fenced code (an unclosed fence, still streaming,
// runs to the end), # headings, - and 1. lists, paragraphs; inline spans as above. -> HTML.
function renderMarkdown(src) {
  const html = [], lines = src.split('\n');
  let para = [], list = null;
  const flushPara = () => {
    if (para.length) html.push('<p>' + para.map(inline).join('<br>') + '</p>');
    para = [];
  };
  const flushList = () => {
    if (list) html.push(`<${list.tag}>` + list.items.map((t) => '<li>' + inline(t) + '</li>').join('') + `</${list.tag}>`);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m = line.match(/^\s*```\s*([\w+#.-]*)\s*$/);
    if (m) {
      flushPara(); flushList();
      const code = [];
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
      const lang = m[1] ? ` data-lang="${escapeHtml(m[1])}"` : '';
      html.push(`<pre><code${lang}>` + escapeHtml(code.join('\n')) + '</code></pre>');
    } else if ((m = line.match(/^(#{1,6})\s+(.*)$/))) {
      flushPara(); flushList();
      const h = Math.min(m[1].length + 2, 6);   // h3..h6: a reply's headings stay below the page's
      html.push(`<h${h}>` + inline(m[2]) + `</h${h}>`);
    } else if ((m = line.match(/^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/))) {
      flushPara();
      const tag = /\d/.test(m[1]) ? 'ol' : 'ul';
      if (list && list.tag !== tag) flushList();
      if (!list) list = { tag, items: [] };
      list.items.push(m[2]);
    } else if (!line.trim()) {
      flushPara(); flushList();
    } else {
      flushList();
      para.push(line);
    }
  }
  flushPara(); flushList();
  return html.join('');
}

// ---- the conversation view ------------------------------------------------------------------

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// One message's element: {root, body, think, thinkBody, stats}.
function addMessage(msg) {
  $('empty').hidden = true;
  const root = el('article', 'msg ' + msg.role);
  root.setAttribute('aria-label', msg.role === 'user' ? 'You' : 'Model');
  const view = { root, body: el('div', 'body'), think: null, thinkBody: null, stats: null };
  root.append(view.body);
  $('log').append(root);
  showMessage(view, msg);
  return view;
}

function showMessage(view, msg) {
  if (msg.reasoning_content) {
    if (!view.think) {
      view.think = el('details', 'think');
      view.think.open = true;
      view.think.append(el('summary', '', 'Thinking'), (view.thinkBody = el('div', 'think-body')));
      view.root.prepend(view.think);
    }
    view.thinkBody.textContent = msg.reasoning_content;   // shown as text, never as HTML
  }
  view.body.innerHTML = renderMarkdown(msg.content || '');
}

function scrollDown() {
  const log = $('log');
  if (log.scrollHeight - log.scrollTop - log.clientHeight < 120) log.scrollTop = log.scrollHeight;
}

// The footer of a finished reply: time to first token, decode speed, prompt and cached tokens.
function showStats(view, s) {
  view.stats = el('footer', 'stats');
  const add = (name, text) => {
    const span = el('span', name, text);
    view.stats.append(span);
  };
  if (s.error) add('status error', s.error);
  else if (s.stopped) add('status', 'stopped');
  if (s.ttft !== null) add('ttft', `TTFT ${Math.round(s.ttft)} ms`);
  const t = s.timings;
  if (t && t.generated_tokens > 1 && t.decode_ms > 0)
    add('tps', `${((t.generated_tokens - 1) * 1000 / t.decode_ms).toFixed(1)} tok/s decode`);
  if (s.usage) {
    add('prompt', `prompt ${s.usage.prompt_tokens} tokens`);
    add('cached', `cached ${s.usage.prompt_tokens_details ? s.usage.prompt_tokens_details.cached_tokens : 0}`);
    add('generated', `generated ${s.usage.completion_tokens}`);
  }
  if (s.finish === 'length') add('finish', 'max tokens reached');
  view.root.append(view.stats);
}

// ---- talking to the server ------------------------------------------------------------------

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (state.key) h.Authorization = 'Bearer ' + state.key;
  return h;
}

function askForKey(message) {
  $('key-form').hidden = false;
  $('key-error').textContent = message || '';
  $('key').focus();
}

async function loadModel() {
  const r = await fetch('/v1/models', { headers: headers(false) });
  if (r.status === 401) {
    state.key = '';
    sessionStorage.removeItem('calla-key');
    askForKey('That key was refused.');
    return;
  }
  const j = await r.json();
  $('model').textContent = j.data && j.data[0] ? j.data[0].id : '';
}

async function start() {
  const health = await fetch('/health').then((r) => r.json()).catch(() => ({}));
  if (health.api_key_required && !state.key) askForKey();
  else await loadModel();
}

function setBusy(controller) {
  state.busy = controller;
  $('send').disabled = !!controller;
  $('stop').disabled = !controller;
}

// Reads a server-sent-event stream; calls onData with each parsed `data:` payload but [DONE].
// Comments (": prefill 4096/8192", ": keep-alive") are skipped.
async function readEvents(response, onData) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of event.split('\n'))
        if (line.startsWith('data:') && line.slice(5).trim() !== '[DONE]') onData(JSON.parse(line.slice(5)));
    }
  }
}

async function send(text) {
  const user = { role: 'user', content: text };
  state.messages.push(user);
  addMessage(user);
  const reply = { role: 'assistant', content: '', reasoning_content: '' };
  const view = addMessage(reply);
  view.root.setAttribute('aria-busy', 'true');
  scrollDown();
  const controller = new AbortController();
  setBusy(controller);
  const s = { ttft: null, timings: null, usage: null, finish: null, error: null, stopped: false };
  let frame = 0;
  const redraw = () => {
    frame = 0;
    showMessage(view, reply);
    if (view.think && reply.content) view.think.open = false;   // the answer has begun
    scrollDown();
  };
  const t0 = performance.now();
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(true), signal: controller.signal,
      body: JSON.stringify({
        messages: state.messages,
        max_tokens: Math.max(1, parseInt($('max-tokens').value, 10) || 256),
        stream: true, stream_options: { include_usage: true },
        chat_template_kwargs: { enable_thinking: $('think').checked },
      }),
    });
    if (!r.ok) {
      const j = await r.json().catch(() => null);
      s.error = (j && j.error && j.error.message) || `HTTP ${r.status}`;
      if (r.status === 401) askForKey('That key was refused.');
    } else {
      await readEvents(r, (d) => {
        if (s.ttft === null) s.ttft = performance.now() - t0;   // the first event comes with the first token
        if (d.error) s.error = d.error.message;
        if (d.usage) s.usage = d.usage;
        if (d.timings) s.timings = d.timings;
        const c = d.choices && d.choices[0];
        if (!c) return;
        if (c.delta && c.delta.reasoning_content) reply.reasoning_content += c.delta.reasoning_content;
        if (c.delta && c.delta.content) reply.content += c.delta.content;
        if (c.finish_reason) s.finish = c.finish_reason;
        if (!frame) frame = requestAnimationFrame(redraw);
      });
    }
  } catch (e) {
    if (e.name === 'AbortError') s.stopped = true;
    else s.error = e.message;
  }
  if (frame) cancelAnimationFrame(frame);
  redraw();
  // The reply stays in the conversation as far as it came (a stopped one too); a failed one goes.
  if (reply.content || reply.reasoning_content) state.messages.push(reply);
  showStats(view, s);
  view.root.removeAttribute('aria-busy');
  scrollDown();
  if (state.busy === controller) setBusy(null);
}

function stop() {
  if (state.busy) state.busy.abort();
}

function newConversation() {
  stop();
  state.messages = [];
  for (const m of document.querySelectorAll('#log .msg')) m.remove();
  $('empty').hidden = false;
  $('input').focus();
}

// ---- wiring ---------------------------------------------------------------------------------

function submit() {
  const text = $('input').value;
  if (state.busy || !text.trim()) return;
  if (!$('key-form').hidden) {
    askForKey('Enter the API key first.');
    return;
  }
  $('input').value = '';
  send(text);
}

document.addEventListener('DOMContentLoaded', () => {
  $('composer').addEventListener('submit', (e) => { e.preventDefault(); submit(); });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {   // Shift+Enter: a new line
      e.preventDefault();
      submit();
    }
  });
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape') stop(); });
  $('stop').addEventListener('click', stop);
  $('new').addEventListener('click', newConversation);
  $('key-form').addEventListener('submit', (e) => {
    e.preventDefault();
    state.key = $('key').value.trim();
    sessionStorage.setItem('calla-key', state.key);
    $('key').value = '';
    $('key-form').hidden = true;
    loadModel().then(() => { if ($('key-form').hidden) $('input').focus(); });
  });
  $('input').focus();
  start().catch((e) => { $('model').textContent = 'server unreachable: ' + e.message; });
});

// For the browser test (tests/test_browser.py) and the curious: the renderer itself.
window.calla = { renderMarkdown, addMessage, state };

// The server's page: its live state (GET status/events, server-sent events read with fetch so
// that the API key goes in a header) and a chat box that streams from v1/chat/completions.
// Paths are relative, so the page works under a proxy's prefix too. Text from the server or
// the model is only ever set as text, never parsed as HTML.
"use strict";

const KEY_STORAGE = "multiseq-api-key";
const RECONNECT_MS = 2000;
const $ = (id) => document.getElementById(id);

// --- the API key ---------------------------------------------------------------------------

function apiKey() { return sessionStorage.getItem(KEY_STORAGE) || ""; }

function authHeaders(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

function askForKey(message) {
  $("key-form").hidden = false;
  $("key-error").textContent = message || "";
  $("key").focus();
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, $("key").value.trim());
  $("key").value = "";
  $("key-form").hidden = true;
  $("forget-key").hidden = false;
  watchState();
  loadModels();
});

$("forget-key").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORAGE);
  $("forget-key").hidden = true;
  askForKey("");
});

class Unauthorized extends Error {}

async function errorMessage(response) {
  try {
    const body = await response.json();
    const error = body.error;
    return (error && (error.message || error)) || `${response.status} ${response.statusText}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// Server-sent events from a fetch response: each event's data, parsed as JSON ([DONE] ends).
async function* serverEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += value;
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const block = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      const data = block.split("\n").filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart()).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

// --- the live state ------------------------------------------------------------------------

let watching = null;

async function watchState() {
  if (watching) watching.abort();
  const controller = watching = new AbortController();
  while (!controller.signal.aborted) {
    try {
      const response = await fetch("status/events", { headers: authHeaders(), signal: controller.signal });
      if (response.status === 401) throw new Unauthorized(await errorMessage(response));
      if (!response.ok) throw new Error(await errorMessage(response));
      setConnection("live", "ok");
      for await (const state of serverEvents(response)) draw(state);
      setConnection("disconnected", "bad");
    } catch (error) {
      if (controller.signal.aborted) return;
      if (error instanceof Unauthorized) {
        setConnection("needs the key", "bad");
        askForKey(apiKey() ? "That key was refused." : "");
        return;
      }
      setConnection("disconnected", "bad");
    }
    await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
  }
}

function setConnection(text, kind) {
  const badge = $("connection");
  badge.textContent = text;
  badge.className = `badge ${kind}`;
}

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    if (cell instanceof Node) { const td = document.createElement("td"); td.append(cell); tr.append(td); }
    else tr.append(element("td", cell[0], cell[1]));
  }
  return tr;
}

function table(headings, rows) {
  const node = document.createElement("table");
  const head = document.createElement("tr");
  for (const heading of headings) head.append(element("th", heading));
  node.append(head, ...rows);
  return node;
}

const number = (value, digits = 0) => value === null || value === undefined ? "–" : Number(value).toFixed(digits);
const seconds = (value) => value < 60 ? `${value.toFixed(1)} s` : `${Math.floor(value / 60)} min ${Math.round(value % 60)} s`;

function meter(share, width = "8em") {
  const outer = element("span", null, "meter");
  const inner = element("span");
  inner.style.width = `${Math.min(100, Math.max(0, share * 100)).toFixed(1)}%`;
  outer.style.width = width;
  outer.append(inner);
  return outer;
}

// A request's id, short enough for a table cell (the whole id in its tooltip).
function shortId(id) { return id.length > 20 ? `${id.slice(0, 15)}…${id.slice(-3)}` : id; }

function requestCell(item) {
  const cell = element("span");
  const id = element("span", shortId(item.request_id), "mono");
  id.title = item.request_id;
  cell.append(element("span", item.api, "badge"), " ", id);
  if (item.client) cell.append(element("div", item.client, "client"));
  return cell;
}

function phaseCell(slot) {
  const cell = element("span", slot.phase === "decode" ? "decoding" : slot.phase, `phase ${slot.phase}`);
  if (slot.phase === "prefill" && slot.prompt_tokens) {
    const done = Math.min(1, slot.kv_cells / slot.prompt_tokens);
    const bar = element("span", null, "progress");
    const fill = element("span");
    fill.style.width = `${(done * 100).toFixed(0)}%`;
    bar.append(fill);
    cell.append(" ", `${(done * 100).toFixed(0)}%`, bar);
  }
  return cell;
}

function slotRow(slot) {
  if (!slot.request_id) {
    const kept = slot.kept_tokens ? `keeps ${slot.kept_tokens} tokens` : "";
    return row([[slot.id, "num"], ["", ""], phaseCell(slot), ["", ""], ["", ""], ["", ""], [slot.kv_cells, "num"], [kept, "tail"]]);
  }
  return row([[slot.id, "num"], requestCell(slot), phaseCell(slot), [slot.generated_tokens, "num"],
    [number(slot.tokens_per_s, 1), "num"], [`${slot.cached_tokens} / ${slot.computed_tokens}`, "num"],
    [slot.kv_cells, "num"], [slot.text_tail, "tail"]]);
}

function queueRow(queued) {
  return row([requestCell(queued), element("span", queued.phase, `phase ${queued.phase}`),
    [queued.prompt_tokens, "num"], [queued.generated_tokens, "num"], [seconds(queued.waited_s), "num"]]);
}

function drawModel(model) {
  const card = element("div", null, "model");
  const head = element("div", null, "model-head");
  head.append(element("strong", model.name), element("span", model.status, `badge ${model.status === "loaded" ? "ok" : model.status === "failed" ? "bad" : ""}`));
  card.append(head);
  if (model.failure) card.append(element("div", model.failure, "error"));
  if (!model.slots) return card;
  const kv = model.kv;
  head.append(element("span", `${model.num_running} running, ${model.num_waiting} waiting`),
    element("span", `${number(model.tokens_per_s, 1)} tokens/s now`),
    element("span", `${model.generated_tokens} generated; prompts ${model.prompt_tokens_reused} reused, ${model.prompt_tokens_computed} computed`));
  const cells = element("span", `KV ${kv.cells_used} / ${kv.cells} cells `);
  cells.append(meter(kv.cells ? kv.cells_used / kv.cells : 0));
  head.append(cells);
  if (kv.ram_cache) head.append(element("span", `RAM cache ${(kv.ram_cache.bytes / 2 ** 20).toFixed(0)} / ${(kv.ram_cache.limit_bytes / 2 ** 20).toFixed(0)} MiB`));
  if (model.device) head.append(element("span", model.device, "muted"));
  if (model.replica) head.append(element("span", `replica ${model.replica}`, "muted"));
  card.append(table(["slot", "request", "phase", "tokens", "tok/s", "prompt cached / computed", "KV cells", "text"],
    model.slots.map(slotRow)));
  if (model.queue.length) {
    card.append(element("h2", `Queue (${model.num_waiting})`));
    card.append(table(["request", "phase", "prompt", "generated", "waited"], model.queue.map(queueRow)));
  }
  return card;
}

const SVG = "http://www.w3.org/2000/svg";

// A plot of the last minutes: a line, or (dots: a value only where requests started) a dot each.
function drawPlot(svg, points, label, dots = false) {
  svg.replaceChildren();
  const values = points.filter((point) => point.value !== null);
  if (!values.length) {
    const text = document.createElementNS(SVG, "text");
    text.setAttribute("x", "4"); text.setAttribute("y", "44"); text.textContent = "no data yet";
    svg.append(text);
    return;
  }
  const top = Math.max(...values.map((point) => point.value)) * 1.1 || 1;
  const first = points[0].at, span = Math.max(points[points.length - 1].at - first, 1);
  const x = (point) => ((point.at - first) / span * 296 + 2).toFixed(1);
  const y = (point) => (78 - point.value / top * 64).toFixed(1);
  if (dots) {
    for (const point of values) {
      const dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("cx", x(point)); dot.setAttribute("cy", y(point)); dot.setAttribute("r", "2.5");
      svg.append(dot);
    }
  } else {
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", values.map((point) => `${x(point)},${y(point)}`).join(" "));
    svg.append(line);
  }
  const scale = document.createElementNS(SVG, "text");
  scale.setAttribute("x", "2"); scale.setAttribute("y", "9");
  scale.textContent = `top ${label(top)} · the last ${seconds(span)}`;
  svg.append(scale);
}

function drawErrors(errors) {
  const list = $("errors");
  list.replaceChildren();
  if (!errors.length) { list.append(element("li", "none", "none")); return; }
  for (const error of errors.slice().reverse()) {
    const item = element("li");
    item.append(element("span", error.status, "status"), element("span", new Date(error.at * 1000).toLocaleTimeString(), "muted"),
      " ", element("span", error.route, "mono"), " ", element("span", error.message));
    list.append(item);
  }
}

function draw(state) {
  $("models").replaceChildren(...state.models.map(drawModel));
  const history = state.history;
  drawPlot($("plot-rate"), history.map((point) => ({ at: point.at, value: point.tokens_per_s })), (top) => top.toFixed(0));
  drawPlot($("plot-ttft"), history.map((point) => ({ at: point.at, value: point.ttft_s })), (top) => top.toFixed(2), true);
  const last = history[history.length - 1];
  $("plot-rate-now").textContent = last ? `(now ${last.tokens_per_s.toFixed(1)})` : "";
  $("plot-ttft-now").textContent = last && last.ttft_s !== null ? `(now ${last.ttft_s.toFixed(2)})` : "";
  const apis = Object.entries(state.requests_by_api).map(([api, count]) => `${api} ${count}`).join(" · ");
  $("apis").textContent = apis ? `Requests by API: ${apis}` : "";
  $("uptime").textContent = `up ${seconds(state.at - state.started_at)}`;
  drawErrors(state.errors);
}

// --- the chat box --------------------------------------------------------------------------

const chat = { messages: [], controller: null, image: null };

async function loadModels() {
  try {
    const response = await fetch("v1/models", { headers: authHeaders() });
    if (!response.ok) return;
    const select = $("chat-model");
    const chosen = select.value;
    select.replaceChildren(...(await response.json()).data.map((card) => element("option", card.id)));
    if (chosen) select.value = chosen;
  } catch { /* the state's stream says when the server cannot be reached */ }
}

$("chat-image").addEventListener("change", () => {
  const file = $("chat-image").files[0];
  chat.image = null;
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => { chat.image = reader.result; };
  reader.readAsDataURL(file);
});

$("chat-input").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("chat-form").requestSubmit(); }
});

$("chat-stop").addEventListener("click", () => { if (chat.controller) chat.controller.abort(); });

$("chat-clear").addEventListener("click", () => {
  if (chat.controller) chat.controller.abort();
  chat.messages = [];
  $("transcript").replaceChildren();
});

$("chat-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text || chat.controller) return;
  $("chat-input").value = "";
  // The image before the question, as vision models' own examples lay them out.
  const content = chat.image ? [{ type: "image_url", image_url: { url: chat.image } }, { type: "text", text }] : text;
  showUserMessage(text, chat.image);
  chat.messages.push({ role: "user", content });
  chat.image = null;
  $("chat-image").value = "";
  sendChat();
});

function showUserMessage(text, image) {
  const node = element("div", text, "message user");
  if (image) { const img = element("img"); img.src = image; img.alt = "attached image"; node.append(img); }
  $("transcript").append(node);
}

function chatBody() {
  const system = $("chat-system").value.trim();
  const body = {
    model: $("chat-model").value || undefined,
    messages: system ? [{ role: "system", content: system }, ...chat.messages] : chat.messages,
    stream: true, stream_options: { include_usage: true },
    temperature: Number($("chat-temperature").value),
    max_tokens: Number($("chat-max-tokens").value) || undefined,
  };
  const tools = $("chat-tools").value.trim();
  if (tools) body.tools = JSON.parse(tools);
  return body;
}

// One assistant turn as it streams: its reasoning apart, its text, its calls.
class AssistantView {
  constructor() {
    this.node = element("div", null, "message assistant");
    this.reasoning = null;
    this.text = element("div");
    this.calls = [];
    this.stats = element("div", null, "stats");
    this.node.append(this.text, this.stats);
    $("transcript").append(this.node);
  }

  addReasoning(piece) {
    if (!this.reasoning) {
      const details = element("details", null, "reasoning");
      details.open = true;
      details.append(element("summary", "reasoning"));
      this.reasoning = element("div");
      details.append(this.reasoning);
      this.node.insertBefore(details, this.text);
    }
    this.reasoning.textContent += piece;
  }

  addText(piece) { this.text.textContent += piece; }

  addCall(delta) {
    const index = delta.index ?? this.calls.length;
    if (!this.calls[index]) {
      this.calls[index] = { id: delta.id, type: "function", function: { name: "", arguments: "" }, node: element("div", null, "call") };
      this.node.insertBefore(this.calls[index].node, this.stats);
    }
    const call = this.calls[index];
    if (delta.function?.name) call.function.name += delta.function.name;
    if (delta.function?.arguments) call.function.arguments += delta.function.arguments;
    call.node.textContent = `call ${call.function.name}(${call.function.arguments})`;
  }

  message() {
    const message = { role: "assistant", content: this.text.textContent };
    if (this.calls.length) message.tool_calls = this.calls.map(({ id, type, function: fn }) => ({ id, type, function: fn }));
    return message;
  }
}

function setChatBusy(busy) {
  $("chat-send").disabled = busy;
  $("chat-stop").disabled = !busy;
}

async function sendChat() {
  const view = new AssistantView();
  const started = performance.now();
  let firstAt = null, usage = null, finish = null;
  chat.controller = new AbortController();
  setChatBusy(true);
  $("chat-status").textContent = "waiting for a slot…";
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify(chatBody()), signal: chat.controller.signal,
    });
    if (response.status === 401) { askForKey("That key was refused."); throw new Error(await errorMessage(response)); }
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const chunk of serverEvents(response)) {
      if (chunk.error) throw new Error(chunk.error.message || String(chunk.error));
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (firstAt === null && (delta.content || delta.reasoning_content || delta.tool_calls)) {
          firstAt = performance.now();
          $("chat-status").textContent = "streaming…";
        }
        if (delta.reasoning_content) view.addReasoning(delta.reasoning_content);
        if (delta.content) view.addText(delta.content);
        for (const call of delta.tool_calls || []) view.addCall(call);
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    chat.messages.push(view.message());
    view.stats.textContent = turnStats(started, firstAt, usage, finish);
  } catch (error) {
    if (error.name === "AbortError") {
      view.stats.textContent = "stopped";
      chat.messages.push(view.message());  // what came before the stop stays in the conversation
    } else {
      view.node.className = "message error";
      view.addText(String(error.message || error));
      chat.messages.pop();  // the user's turn goes with the answer it did not get
    }
  } finally {
    chat.controller = null;
    setChatBusy(false);
    $("chat-status").textContent = "";
  }
}

function turnStats(started, firstAt, usage, finish) {
  const parts = [];
  if (firstAt !== null) parts.push(`first token ${((firstAt - started) / 1000).toFixed(2)} s`);
  if (usage) {
    const seconds = (performance.now() - (firstAt ?? started)) / 1000;
    parts.push(`${usage.prompt_tokens} prompt tokens`, `${usage.completion_tokens} generated`);
    if (seconds > 0 && usage.completion_tokens > 1) parts.push(`${(usage.completion_tokens / seconds).toFixed(1)} tokens/s`);
  }
  if (finish) parts.push(`finished: ${finish}`);
  return parts.join(" · ");
}

// --- start ---------------------------------------------------------------------------------

$("forget-key").hidden = !apiKey();
watchState();
loadModels();

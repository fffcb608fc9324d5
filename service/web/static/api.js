/* The public API (/api/v1), as the page reads and writes it: requests carry the saved key, an
 * error answer is raised as an ApiError with the API's `error: detail`, reads go through a limit
 * of six in flight (what browsers allow per host) and the header's status line counts them. A
 * 429 (the rate limit) is waited out per its Retry-After and the status line says so.
 * Answers pinned to a run id never change, so `get(target, true)` keeps them.
 */

import { apiKey } from "./state.js";

export const V1 = "/api/v1";
const MAX_PARALLEL = 6;

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.detail ? `${body.error}: ${body.detail}` : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

const cache = new Map();
let active = 0;
const waiting = [];

async function slot(fn) {
  if (active >= MAX_PARALLEL) await new Promise((resolve) => waiting.push(resolve));
  active += 1;
  showStatus();
  try {
    return await fn();
  } finally {
    active -= 1;
    showStatus();
    const next = waiting.shift();
    if (next) next();
  }
}

/* `/api/v1{path}` with the parameters that have a value. */
export function url(path, params = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") query.set(k, v);
  }
  const q = query.toString();
  return q ? `${V1}${path}?${q}` : `${V1}${path}`;
}

/* How long a request waits out the rate limit (429) in all before its error is shown, as the
 * Python client does; each wait is the answer's Retry-After (seconds). */
const RATE_LIMIT_WAIT_S = 60;
let limitedMessage = null;  // the status line while some request waits out a 429

function retryAfter(response) {
  const value = response.headers.get("Retry-After");
  const seconds = Number(value);
  if (value !== null && Number.isFinite(seconds)) return Math.max(1, seconds);
  const date = value === null ? NaN : Date.parse(value);
  return Number.isNaN(date) ? 1 : Math.max(1, Math.ceil((date - Date.now()) / 1000));
}

/* One request, outside the parallelism limit; the parsed JSON answer, or an ApiError. A 429
 * (nothing was done) is waited out per its Retry-After, saying so in the status line, and the
 * request sent again, up to RATE_LIMIT_WAIT_S in all. */
export async function request(method, target, body) {
  const headers = { Accept: "application/json" };
  const key = apiKey();
  if (key) headers["X-API-Key"] = key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  for (let waited = 0; ;) {
    response = await fetch(target, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status !== 429 || waited >= RATE_LIMIT_WAIT_S) break;
    const wait = Math.min(retryAfter(response), RATE_LIMIT_WAIT_S - waited);
    limitedMessage = `rate limited by the service (HTTP 429): waiting ${wait} s, then trying `
      + "again";
    window.strata.rateLimited = (window.strata.rateLimited || 0) + 1;
    showStatus(limitedMessage);
    await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    waited += wait;
  }
  if (response.ok && limitedMessage !== null
      && document.getElementById("status").dataset.message === limitedMessage) {
    limitedMessage = null;
    showStatus("");
  }
  const text = await response.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch (e) { parsed = { detail: text }; }
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

/* A GET through the parallelism limit; `keep` caches it (answers pinned to a run). */
export function get(target, keep = false) {
  if (keep && cache.has(target)) return cache.get(target);
  const promise = slot(() => request("GET", target));
  if (keep) {
    cache.set(target, promise);
    promise.catch(() => cache.delete(target));
  }
  return promise;
}

/* Every item of a paged list endpoint. */
export async function pages(path, params = {}) {
  const items = [];
  let offset = 0;
  for (;;) {
    const page = await get(url(path, { ...params, limit: 500, offset }));
    items.push(...page.items);
    if (page.next_offset === null || page.next_offset === undefined) return items;
    offset = page.next_offset;
  }
}

/* The header's status line: requests in flight, then the last message (kept until replaced). */
export function showStatus(text) {
  const el = document.getElementById("status");
  if (text !== undefined) el.dataset.message = text;
  const message = el.dataset.message || "";
  el.textContent = active ? `loading (${active + waiting.length})… ${message}` : message;
}

// The server's public HTTP API, as the page uses it: JSON requests, errors in their documented
// shapes, and server-sent events read from a fetch body.
const API_KEY = "bubo.apiKey"; // sessionStorage: gone when the tab closes

export class ApiError extends Error {
  constructor(status, body, retryAfter) {
    super(describeError(status, body, retryAfter));
    this.status = status;
    this.code = body && body.error && body.error.code;
  }
}

export function describeError(status, body, retryAfter) {
  const error = (body && body.error) || {};
  const message = typeof error === "string" ? error : error.message || "";
  const code = error.code || error.type || "";
  const param = error.param ? ` (${error.param})` : "";
  const wait = retryAfter ? ` Try again in ${retryAfter} s.` : "";
  if (status === 401) return "The server refused the API key (401). Enter the key again.";
  if (code === "queue_full") return `The server is busy: its queue is full (503 queue_full).${wait}\n${message}`;
  if (code === "memory_pressure") return `The server is low on memory (503 memory_pressure).${wait}\n${message}`;
  if (code === "insufficient_memory") return `The server has too little memory for this request now (503 insufficient_memory).${wait}\n${message}`;
  if (code === "not_ready") return `The model is not ready yet (503 not_ready).${wait}\n${message}`;
  return `Error${status ? ` ${status}` : ""}${code ? ` ${code}` : ""}${param}: ${message || "the request failed"}`;
}

export const apiKey = {
  get: () => sessionStorage.getItem(API_KEY),
  set: (key) => sessionStorage.setItem(API_KEY, key),
};

let onUnauthorized = () => {};
export function whenUnauthorized(callback) {
  onUnauthorized = callback;
}

export async function api(path, { body, signal, headers = {} } = {}) {
  const sent = { ...headers };
  if (body !== undefined) sent["Content-Type"] = "application/json";
  const key = apiKey.get();
  if (key) sent.Authorization = `Bearer ${key}`;
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: sent,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await errorOf(response);
  return response;
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (response.status === 401) onUnauthorized("The server refused this key.");
  return new ApiError(response.status, body, response.headers.get("Retry-After"));
}

// Server-sent events from a fetch body: yields each event's data field. Leaving the loop early
// (an error, a parse failure) cancels the body, which closes the connection.
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = frame
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).replace(/^ /, ""))
          .join("\n");
        if (data) yield data;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// Streams from a Bubo server with the `openai` npm package (the SDK qwen-code and many JavaScript apps use)
// and prints every chunk it parsed, and what its stream helper assembled, as one JSON object.
// Usage: node openai_client.mjs MODULE_PATH BASE_URL SCENARIO PROMPT
//   MODULE_PATH: openai's index.mjs (installed by the tests with npm ci); SCENARIO: chat, completions.
//   tests/e2e/test_keepalive_clients.py runs it and checks the result.

const [modulePath, baseURL, scenario, prompt] = process.argv.slice(2);
const { default: OpenAI } = await import(modulePath);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });

async function chat() {
  const chunks = [];
  const stream = client.chat.completions.stream({
    model: "bubo",
    messages: [{ role: "user", content: prompt }],
    max_tokens: 24,
    temperature: 0,
    stream_options: { include_usage: true },
  });
  stream.on("chunk", (chunk) => chunks.push(chunk));
  const final = await stream.finalChatCompletion();
  return { chunks, message: final.choices[0].message, finish_reason: final.choices[0].finish_reason };
}

async function completions() {
  const chunks = [];
  const stream = await client.completions.create({
    model: "bubo",
    prompt,
    max_tokens: 12,
    temperature: 0,
    stream: true,
  });
  for await (const chunk of stream) chunks.push(chunk);
  return { chunks };
}

const scenarios = { chat, completions };
console.log(JSON.stringify(await scenarios[scenario]()));

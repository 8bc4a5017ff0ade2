// Drives a Bubo server with the `ollama` npm package (ollama-js), as an app would, and prints what it saw
// as one JSON object. Usage: node ollama_client.mjs MODULE_PATH HOST SCENARIO
//   MODULE_PATH: ollama-js's dist/index.mjs (installed by the tests with npm ci); SCENARIO: basic, coder,
//   thinking. tests/e2e/test_ollama_clients.py runs it and checks the result.

const [modulePath, host, scenario] = process.argv.slice(2);
const { Ollama } = await import(modulePath);
const ollama = new Ollama({ host });
const greedy = { temperature: 0, top_k: 1 };

async function basic() {
  const list = await ollama.list();
  const show = await ollama.show({ model: "bubo" });
  const whole = await ollama.chat({
    model: "bubo",
    messages: [{ role: "user", content: "Say hello." }],
    options: { ...greedy, num_predict: 8 },
  });
  const parts = [];
  let last = null;
  for await (const part of await ollama.chat({
    model: "bubo:latest",
    messages: [{ role: "user", content: "Say hello." }],
    options: { ...greedy, num_predict: 8 },
    stream: true,
  })) {
    parts.push(part.message.content);
    last = part;
  }
  const raw = await ollama.generate({
    model: "bubo",
    prompt: "The capital of France is",
    raw: true,
    options: { ...greedy, num_predict: 4 },
  });
  const schema = { type: "object", properties: { legs: { type: "integer" } }, required: ["legs"] };
  const formatted = await ollama.chat({
    model: "bubo",
    messages: [{ role: "user", content: "How many legs does a cat have? Reply in JSON." }],
    format: schema,
    options: { ...greedy, num_predict: 32 },
  });
  return {
    names: list.models.map((m) => m.name),
    modified: list.models[0].modified_at,
    capabilities: show.capabilities,
    context_length: show.model_info["llama.context_length"],
    whole: { content: whole.message.content, done: whole.done, eval_count: whole.eval_count },
    stream: { parts, last_done: last.done, last_reason: last.done_reason, eval_count: last.eval_count },
    raw: { response: raw.response, done_reason: raw.done_reason, context: raw.context ?? null },
    formatted: formatted.message.content,
  };
}

async function coder() {
  const tools = [
    {
      type: "function",
      function: {
        name: "get_weather",
        description: "Get the current weather for a city",
        parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
      },
    },
  ];
  const question = [{ role: "user", content: "What is the weather in Paris right now?" }];
  const called = await ollama.chat({ model: "bubo", messages: question, tools, options: greedy });
  const call = called.message.tool_calls[0];
  const answered = await ollama.chat({
    model: "bubo",
    messages: [
      ...question,
      called.message,
      { role: "tool", tool_name: call.function.name, content: '{"temperature": "24 C", "sky": "sunny"}' },
    ],
    tools,
    options: { ...greedy, num_predict: 32 },
  });
  const filled = await ollama.generate({
    model: "bubo",
    prompt: "def add(a, b):\n    return ",
    suffix: "\n",
    options: { ...greedy, num_predict: 8 },
  });
  const embedded = await ollama.embed({ model: "bubo", input: ["The cat sat.", "A dog ran."] });
  return {
    call: { name: call.function.name, arguments: call.function.arguments },
    answer: answered.message.content,
    filled: filled.response,
    dimensions: embedded.embeddings.map((e) => e.length),
  };
}

async function thinking() {
  const answer = await ollama.chat({
    model: "bubo",
    messages: [{ role: "user", content: "Say hi." }],
    think: true,
    options: greedy,
  });
  return { thinking: answer.message.thinking, content: answer.message.content };
}

const scenarios = { basic, coder, thinking };
console.log(JSON.stringify(await scenarios[scenario]()));

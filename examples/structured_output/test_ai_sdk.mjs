// The Vercel AI SDK's generateObject through Switchyard's doors, answered by
// `switchyard mock-upstream`s that honour the schema. Run by
// tests/structured_output.rs with a switchyard whose route `schema_openai`
// goes to an OpenAI-shaped mock (with the `json_schema` capability) and route
// `schema_anthropic` to an Anthropic-shaped one.
//
//   npm ci --prefix examples/structured_output
//   node examples/structured_output/test_ai_sdk.mjs --base-url http://127.0.0.1:8080 \
//       --primary http://127.0.0.1:8001 --secondary http://127.0.0.1:8002
//
// - openai.chat(...): Chat Completions `response_format` json_schema.
// - openai(...): the Responses API (the provider's default), `text.format`.
// - anthropic(...) with structuredOutputMode "jsonTool": one tool `json`, forced;
//   and with "outputFormat", `output_config.format`.
// Prints one PASS/FAIL line per check; exits 1 if any check failed.
import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAI } from '@ai-sdk/openai';
import { generateObject } from 'ai';
import assert from 'node:assert/strict';
import { parseArgs } from 'node:util';
import { z } from 'zod';

const { values: args } = parseArgs({
  options: {
    'base-url': { type: 'string' },
    primary: { type: 'string' },
    secondary: { type: 'string' },
  },
});
const base = args['base-url'];
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: 'unused-in-open-mode' });
const anthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: 'unused-in-open-mode' });

const Person = z.object({
  name: z.string().describe('Full name'),
  age: z.number().int().min(18),
  role: z.enum(['admin', 'user']),
});
const PROMPT = 'Who is the admin? Answer with the person.';

/** The mock's request log, then cleared. */
async function takeLog(mock) {
  const log = await (await fetch(`${mock}/_mock/requests`)).json();
  await fetch(`${mock}/_mock/requests`, { method: 'DELETE' });
  return log;
}

function assertPerson(p, age = 18) {
  // The mock's instance of the schema: the tokens in the first plain string,
  // the lowest allowed integer, the first enum value.
  assert.ok(p.name.startsWith('tok0 tok1 '), JSON.stringify(p));
  assert.equal(p.age, age);
  assert.equal(p.role, 'admin');
}

async function chatCompletions() {
  const { object } = await generateObject({
    model: openai.chat('schema_openai'), schema: Person, prompt: PROMPT, maxRetries: 0,
  });
  assertPerson(object);
  const log = await takeLog(args.primary);
  assert.equal(log.length, 1);
  const fmt = log[0].body.response_format;
  assert.equal(fmt.type, 'json_schema');
  assert.equal(fmt.json_schema.strict, true);
  assert.equal(fmt.json_schema.schema.properties.age.minimum, 18);
}

async function responsesApi() {
  const { object } = await generateObject({
    model: openai('schema_openai'), schema: Person, prompt: PROMPT, maxRetries: 0,
  });
  assertPerson(object);
  // The Responses door carried text.format as the upstream's response_format.
  const log = await takeLog(args.primary);
  assert.equal(log.length, 1);
  assert.equal(log[0].body.response_format.type, 'json_schema');
  assert.deepEqual(log[0].body.response_format.json_schema.schema.required, ['name', 'age', 'role']);
}

async function anthropicJsonTool() {
  const { object } = await generateObject({
    model: anthropic('schema_anthropic'), schema: Person, prompt: PROMPT, maxRetries: 0,
    maxOutputTokens: 1024,
    providerOptions: { anthropic: { structuredOutputMode: 'jsonTool' } },
  });
  assertPerson(object);
  const log = await takeLog(args.secondary);
  assert.equal(log.length, 1);
  // The one tool, forced (`any`: the SDK asks for a required tool call).
  assert.deepEqual(log[0].body.tools.map((t) => t.name), ['json']);
  assert.equal(log[0].body.tool_choice.type, 'any');
  assert.equal(log[0].body.tools[0].input_schema.properties.age.minimum, 18);
}

async function anthropicOutputFormat() {
  // output_config.format (the provider's default for the Claude models it
  // knows; a route name is not one). It moves bounds into the description, so
  // this schema has none (the mock answers 0).
  const Loose = z.object({ name: z.string(), age: z.number().int(), role: z.enum(['admin', 'user']) });
  const { object } = await generateObject({
    model: anthropic('schema_anthropic'), schema: Loose, prompt: PROMPT, maxRetries: 0,
    maxOutputTokens: 1024,
    providerOptions: { anthropic: { structuredOutputMode: 'outputFormat' } },
  });
  assertPerson(object, 0);
  const log = await takeLog(args.secondary);
  assert.equal(log.length, 1);
  assert.equal(log[0].body.output_config.format.type, 'json_schema');
  assert.equal(log[0].body.tools, undefined);
}

let failed = 0;
const checks = [chatCompletions, responsesApi, anthropicJsonTool, anthropicOutputFormat];
for (const check of checks) {
  try {
    await check();
    console.log(`PASS ${check.name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${check.name}\n${e.stack}`);
    if (e.responseBody) console.log(`  response body: ${String(e.responseBody).slice(0, 600)}`);
  }
}
console.log(`ai sdk checks: ${checks.length - failed} ok, ${failed} failed`);
process.exit(failed ? 1 : 0);

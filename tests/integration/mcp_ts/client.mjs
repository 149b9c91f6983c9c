// The official TypeScript MCP SDK's client (@modelcontextprotocol/sdk 1.x, its experimental
// tasks API) driving the MCP door, one step per run, so the test waits between steps and each
// step is a new connection (any replica may answer).
//
//   node client.mjs URL TOKEN STEP [ARG]
//
// STEP: plain TOOL ARGS_JSON | stream TOOL ARGS_JSON | create TOOL ARGS_JSON | get TASK_ID |
// list | cancel TASK_ID | result TASK_ID. Prints one JSON object on stdout.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token, step, first, second] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "toolfleet-ts-test", version: "1.0.0" });
await client.connect(transport);
const tasks = client.experimental.tasks;
const textOf = (result) => result?.content?.[0]?.text;

async function run() {
  switch (step) {
    case "plain": {
      const result = await client.callTool({ name: first, arguments: JSON.parse(second) });
      return { isError: result.isError, text: textOf(result), meta: result._meta };
    }
    case "stream": {
      const messages = [];
      const stream = tasks.callToolStream(
        { name: first, arguments: JSON.parse(second) },
        undefined,
        { task: { ttl: 120000 } },
      );
      for await (const message of stream) {
        messages.push({
          type: message.type,
          taskId: message.task?.taskId,
          status: message.task?.status,
          text: textOf(message.result),
          meta: message.result?._meta,
          error: message.error?.message,
        });
      }
      return { messages };
    }
    case "create": {
      const stream = tasks.callToolStream(
        { name: first, arguments: JSON.parse(second) },
        undefined,
        { task: { ttl: 120000 } },
      );
      for await (const message of stream) {
        if (message.type === "taskCreated") return { task: message.task };
        if (message.type === "error") return { error: message.error?.message };
      }
      return { error: "no task created" };
    }
    case "get":
      return { task: await tasks.getTask(first) };
    case "list":
      return { tasks: (await tasks.listTasks()).tasks };
    case "cancel":
      return { task: await tasks.cancelTask(first) };
    case "result": {
      const result = await tasks.getTaskResult(first, CallToolResultSchema);
      return { isError: result.isError, text: textOf(result), meta: result._meta };
    }
    default:
      throw new Error(`unknown step ${step}`);
  }
}

try {
  console.log(JSON.stringify(await run()));
} catch (error) {
  console.log(JSON.stringify({ error: String(error?.message ?? error) }));
} finally {
  await client.close();
}

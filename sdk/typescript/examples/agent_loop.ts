/**
 * A minimal agent loop with @spaced/sdk.
 *
 * An agent (here: a fixed plan standing in for a model's tool calls) gets a
 * sandbox, writes a program into it, runs it, reads what it produced, and
 * cleans up. Run it against a cluster:
 *
 *     spacectl dev up --dir /tmp/dev && . /tmp/dev/env
 *     cd sdk/typescript && npm run build && npm run example
 */
import { Sandbox } from "@spaced/sdk";

type Step = { tool: "write"; path: string; content: string } | { tool: "run"; cmd: string } | { tool: "read"; path: string };

// What a model would ask for, one tool call at a time.
const plan: Step[] = [
  { tool: "write", path: "/workspace/calc.sh", content: 'echo "6 * 7 = $((6 * 7))" > /workspace/answer.txt\n' },
  { tool: "run", cmd: "sh /workspace/calc.sh" },
  { tool: "read", path: "/workspace/answer.txt" },
];

async function main(): Promise<void> {
  const sbx = await Sandbox.create();
  console.log("sandbox", sbx.id);
  try {
    for (const step of plan) {
      if (step.tool === "write") {
        await sbx.files.write(step.path, step.content);
        console.log("wrote", step.path);
      } else if (step.tool === "run") {
        const r = await sbx.commands.run(step.cmd, { onStderr: (s) => process.stdout.write(`stderr: ${s}`) });
        console.log(`ran ${JSON.stringify(step.cmd)}: exit ${r.exitCode}`);
        if (r.exitCode !== 0) throw new Error("the command failed");
      } else {
        console.log((await sbx.files.readText(step.path)).trim());
      }
    }
  } finally {
    await sbx.kill();
    sbx.connection.close();
  }
  console.log("agent loop: done");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

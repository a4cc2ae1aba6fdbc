#!/usr/bin/env python3
"""A minimal agent loop with the spaced Python SDK.

An agent (here: a fixed plan standing in for a model's tool calls) gets a
sandbox, writes a program into it, runs it, reads what it produced, and
cleans up. Run it against a cluster:

    spacectl dev up --dir /tmp/dev && . /tmp/dev/env
    PYTHONPATH=sdk/python python3 sdk/python/examples/agent_loop.py
"""

import spaced

# What a model would ask for, one tool call at a time.
PLAN = [
    ("write", "/workspace/calc.sh", "echo \"6 * 7 = $((6 * 7))\" > /workspace/answer.txt\n"),
    ("run", "sh /workspace/calc.sh"),
    ("read", "/workspace/answer.txt"),
]


def main():
    with spaced.Sandbox.create() as sbx:  # deleted when the block ends
        print("sandbox", sbx.id)
        for step in PLAN:
            if step[0] == "write":
                sbx.files.write(step[1], step[2])
                print("wrote", step[1])
            elif step[0] == "run":
                r = sbx.commands.run(step[1], on_stderr=lambda s: print("stderr:", s, end=""))
                print("ran %r: exit %d" % (step[1], r.exit_code))
                if r.exit_code != 0:
                    raise SystemExit("the command failed")
            elif step[0] == "read":
                print(sbx.files.read(step[1]).decode().strip())
    print("agent loop: done")


if __name__ == "__main__":
    main()

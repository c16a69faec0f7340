"""Ollama's JavaScript client (the `ollama` npm package) against `multiseq serve`: its documented
calls, unchanged but for the host, each said to answer or not.

Usage (from the repository root, in the project's virtual environment; Node.js and npm on PATH):

    python bench/ollama_js.py [--model smollm2-135m] [--package ollama@0.6]

The package is installed from npm into a cache folder once. One `multiseq serve -m MODEL -np 4`
on a free loopback port; the script then runs chat (whole and streamed), generate (streamed),
embed (two inputs), a chat with tools, a chat with a JSON schema as `format`, list, show, ps and
pull (of the served model: answered at once), and prints one line per call. The last line is
one JSON object; the exit status is 1 when any call failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import peers  # bench/ is the script's own folder, first on sys.path
from multiseq.models import cache_dir

SCRIPT = r"""
import { Ollama } from 'ollama'
const [host, model] = process.argv.slice(2)
const ollama = new Ollama({ host })
const messages = [{ role: 'user', content: 'Name a colour.' }]
const options = { temperature: 0, num_predict: 16 }
const weather = { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }
const schema = { type: 'object', properties: { colour: { type: 'string' } }, required: ['colour'] }
const calls = {
  chat: async () => (await ollama.chat({ model, messages, options })).message.content,
  chat_streamed: async () => {
    let text = ''
    for await (const part of await ollama.chat({ model, messages, options, stream: true })) text += part.message.content
    return text
  },
  generate_streamed: async () => {
    let text = '', done = null
    for await (const part of await ollama.generate({ model, prompt: 'The sky is', options, stream: true })) {
      text += part.response
      if (part.done) done = part.done_reason
    }
    return `${text} (${done})`
  },
  embed: async () => (await ollama.embed({ model, input: ['a cat', 'a dog'] })).embeddings.map(v => v.length).join(','),
  tools: async () => {
    const reply = await ollama.chat({ model, messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools: [weather], options })
    return JSON.stringify(reply.message.tool_calls ?? reply.message.content)
  },
  format_schema: async () => JSON.parse((await ollama.chat({ model, messages, format: schema, options:
    { temperature: 0, num_predict: 64 } })).message.content).colour,
  list: async () => (await ollama.list()).models.map(m => m.name).join(','),
  show: async () => Object.keys((await ollama.show({ model })).model_info).length + ' model_info keys',
  ps: async () => (await ollama.ps()).models.map(m => `${m.name} ${m.context_length}`).join(','),
  pull: async () => (await ollama.pull({ model })).status,
}
const results = {}
for (const [name, call] of Object.entries(calls)) {
  try { results[name] = { ok: true, answer: String(await call()) } }
  catch (error) { results[name] = { ok: false, answer: String(error) } }
}
console.log(JSON.stringify(results))
"""


def installed(package: str) -> Path:
    """A folder with the npm package installed (once, in the cache)."""
    folder = cache_dir() / "npm" / package.replace("/", "_").replace("@", "-")
    if not (folder / "node_modules" / "ollama").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "package.json").write_text('{"type": "module", "private": true}')
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", package], cwd=folder, check=True,
                       stdout=subprocess.DEVNULL)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--package", default="ollama@0.6")
    args = parser.parse_args()
    folder = installed(args.package)
    (folder / "calls.mjs").write_text(SCRIPT)
    port = peers._free_port()
    command = [sys.executable, "-m", "multiseq.cli.main", "serve", "-m", args.model, "-np", "4", "--port", str(port),
               "--no-dashboard"]
    with tempfile.TemporaryDirectory(prefix="multiseq-ollama-js-") as log_folder:
        process, base = peers.start_server(command, Path(log_folder) / "serve.log", port)
        try:
            ran = subprocess.run(["node", "calls.mjs", base, args.model], cwd=folder, capture_output=True, text=True,
                                 timeout=600)
        finally:
            peers._stop(process)
    if ran.returncode != 0:
        raise SystemExit(f"node failed: {ran.stderr[-2000:]}")
    results = json.loads(ran.stdout.strip().splitlines()[-1])
    for name, result in results.items():
        print(f"{name:18} {'ok    ' if result['ok'] else 'FAILED'} {result['answer'][:100]!r}")
    print(json.dumps({"package": args.package, "model": args.model, "results": results}))
    sys.exit(0 if all(result["ok"] for result in results.values()) else 1)


if __name__ == "__main__":
    main()

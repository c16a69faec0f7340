"""The server page's screenshot in docs/: a real model, 8 clients streaming, a chat sent from the
page, drawn by Debian's headless Chromium.

Usage (from the repository root, in the project's virtual environment, with Debian's chromium
and chromium-driver installed):

    python bench/page_screenshot.py [--out docs/page.png]

It starts `multiseq serve -m smollm2-135m -np 9`, streams 8 long chats from threads of its own,
opens the page, sends a chat from its box, waits for the answer to end, and saves the window.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import load  # noqa: E402 - bench/load.py, beside this file
import peers  # noqa: E402

QUESTION = "Write a haiku about sharing one model."
TOPICS = ("rivers", "compilers", "bread", "tides", "old maps", "bees", "lighthouses", "snow")


def stream_chat(port: int, topic: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": "smollm2-135m", "stream": True, "max_tokens": 2000, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Tell me a long story about {topic}."}]}
    connection.request("POST", "/v1/chat/completions", json.dumps(body),
                       {"Content-Type": "application/json", "User-Agent": f"story-client/{topic.replace(' ', '-')}"})
    try:
        connection.getresponse().read()
    except OSError:
        pass


def browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     f"--window-size={width},{height}", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/page.png"))
    args = parser.parse_args()
    port = peers._free_port()
    command = load.multiseq_command(argparse.Namespace(model="smollm2-135m", parallel=9, slot_ctx=2048, threads=2,
                                                       step_tokens=None), port)
    with tempfile.TemporaryDirectory() as tmp, load.running(command, port, Path(tmp) / "serve.log"):
        for topic in TOPICS:
            threading.Thread(target=stream_chat, args=(port, topic), daemon=True).start()
        driver = browser(1500, 1250)
        try:
            driver.get(f"http://127.0.0.1:{port}/")
            time.sleep(20)  # the stories under way, the plots with ten points
            driver.find_element("id", "chat-input").send_keys(QUESTION + "\n")
            deadline = time.monotonic() + 120
            while "finished" not in driver.execute_script(
                    "return document.querySelector('.message.assistant .stats')?.textContent || ''"):
                if time.monotonic() > deadline:
                    raise SystemExit("the page's chat did not finish in 120 s")
                time.sleep(0.5)
            time.sleep(1)
            driver.save_screenshot(str(args.out))
        finally:
            driver.quit()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""The server's page in a real browser: Debian's headless Chromium, driven by Selenium through
its chromedriver, loads the page from a running server, asks for the API key and sends it,
sends a chat and sees the answer stream in, and sees the slots busy while 8 other clients
stream. Without the browser (a machine where `.ci/run` could not install Debian's chromium and
chromium-driver) the tests are skipped, saying so."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from fakes import FakeBackend, LatestMention, fake_media_name
from helpers import wait_until
from multiseq.server import ServerSettings, create_app
from test_page_unit import LONG_CHAT, stream_in_background

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="no browser: install Debian's chromium and chromium-driver (.ci/run does)")


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 80, 40)).save(buffer, format="PNG")
    return buffer.getvalue()


KEY = "page-key"
QUESTION = "Hello from the page"
ANSWER = "The page streamed this answer, piece by piece."
IMAGE = _png(8, 6)
IMAGE_QUESTION, IMAGE_ANSWER = "What is in it?", "A picture, sent from the page."
NUM_STREAMS = 8


@pytest.fixture
def browser(tmp_path):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # Headless, and nothing that reaches for the network on its own (this machine may be offline).
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-quic", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def busy_server(make_runner, serve_app):
    """A server with the key, 9 slots on the fake backend (a step 20 ms), answering QUESTION."""
    backend = FakeBackend(num_slots=NUM_STREAMS + 1, window=200_000, n_batch=64, decode_delay=0.02,
                          replies={f"<user>{QUESTION}<assistant>": ANSWER,
                                   f"<user>{fake_media_name(IMAGE)}{IMAGE_QUESTION}<assistant>": IMAGE_ANSWER})
    runner = make_runner(backend)
    base = serve_app(create_app(runner, ServerSettings(model_name="fake", api_key=KEY)))
    return base, runner


def _text(driver, css: str) -> str:
    """The text of every element `css` selects, read at one moment (the page redraws 4 times a second)."""
    return driver.execute_script("return Array.from(document.querySelectorAll(arguments[0]))"
                                 ".map((node) => node.textContent).join(' ');", css)


def _page_errors(driver) -> list[str]:
    """What the browser's console says went wrong: a script error, or something the policy
    blocked (a refusal the page was meant to get, the 401 that makes it ask for the key, aside)."""
    return [entry["message"] for entry in driver.get_log("browser")
            if ("Content Security Policy" in entry["message"] or entry["level"] == "SEVERE")
            and "status of 401" not in entry["message"]]


def test_the_page_asks_for_the_key_then_chats_while_eight_clients_stream(browser, busy_server):
    base, runner = busy_server
    browser.get(base + "/")
    wait_until(lambda: browser.find_element("id", "key-form").is_displayed(), what="the key asked for")
    browser.find_element("id", "key").send_keys(KEY + "\n")
    wait_until(lambda: "live" in browser.find_element("id", "connection").text, what="the state streaming")
    wait_until(lambda: "fake" in _text(browser, ".model-head"), what="the model shown")

    for _ in range(NUM_STREAMS):
        stream_in_background(base, LONG_CHAT, {"Authorization": f"Bearer {KEY}"})
    wait_until(lambda: _text(browser, ".phase.decode").count("decoding") >= NUM_STREAMS, timeout=20,
               what="8 slots shown decoding")
    assert "chat" in _text(browser, "td .badge") and "page-test/1.0" in _text(browser, "td")

    wait_until(lambda: browser.find_elements("css selector", "#chat-model option"), what="the models listed")
    browser.find_element("id", "chat-temperature").clear()
    browser.find_element("id", "chat-temperature").send_keys("0")
    browser.find_element("id", "chat-input").send_keys(QUESTION + "\n")
    wait_until(lambda: ANSWER in _text(browser, ".message.assistant"), timeout=20, what="the answer streamed")
    wait_until(lambda: "finished: stop" in _text(browser, ".message.assistant .stats"), what="the turn's numbers")
    assert _text(browser, ".message.user") == QUESTION
    assert _page_errors(browser) == []

    runner.cancel_all()
    wait_until(lambda: "decoding" not in _text(browser, ".phase"), timeout=20, what="the slots idle again")


def test_the_page_shows_a_refused_chat_as_an_error(browser, busy_server):
    base, _ = busy_server
    browser.get(base + "/")
    browser.execute_script(f"sessionStorage.setItem('multiseq-api-key', {json.dumps(KEY)}); location.reload();")
    wait_until(lambda: "live" in browser.find_element("id", "connection").text, what="the state streaming")
    browser.find_element("css selector", "#chat details summary").click()
    browser.find_element("id", "chat-tools").send_keys('[{"type": "function"}]')
    browser.find_element("id", "chat-input").send_keys(QUESTION + "\n")
    wait_until(lambda: _text(browser, ".message.error"), timeout=20, what="the error shown")
    assert "tools" in _text(browser, ".message.error")
    wait_until(lambda: "400" in _text(browser, "#errors .status"), what="the error listed with the recent ones")


def test_the_page_sends_an_image_with_a_question(browser, busy_server, tmp_path):
    base, _ = busy_server
    picture = tmp_path / "picture.png"
    picture.write_bytes(IMAGE)
    browser.get(base + "/")
    browser.execute_script(f"sessionStorage.setItem('multiseq-api-key', {json.dumps(KEY)}); location.reload();")
    wait_until(lambda: "live" in browser.find_element("id", "connection").text, what="the state streaming")
    browser.find_element("id", "chat-image").send_keys(str(picture))
    wait_until(lambda: browser.execute_script("return document.getElementById('chat-image').files.length") == 1,
               what="the image chosen")
    browser.find_element("id", "chat-input").send_keys(IMAGE_QUESTION + "\n")
    wait_until(lambda: IMAGE_ANSWER in _text(browser, ".message.assistant"), timeout=20, what="the answer on the image")
    assert browser.find_elements("css selector", ".message.user img")  # the image shown with the question



WEATHER_TOOL = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}}]
THOUGHT = "The user asks about spiders: eight."


def _chat_from_the_page(browser, base: str, question: str, tools: list | None = None) -> None:
    browser.get(base + "/")
    wait_until(lambda: "live" in browser.find_element("id", "connection").text, what="the state streaming")
    if tools is not None:
        browser.find_element("css selector", "#chat details summary").click()
        browser.find_element("id", "chat-tools").send_keys(json.dumps(tools))
    browser.find_element("id", "chat-input").send_keys(question + "\n")
    wait_until(lambda: "finished" in _text(browser, ".message.assistant .stats"), timeout=20, what="the turn's end")


def test_the_page_shows_a_call_as_a_call(browser, make_runner, serve_app):
    backend = FakeBackend(num_slots=2, window=4096, n_batch=64)  # the generic format: {"tool_calls": [...]}
    backend.replies = LatestMention({"What is the weather in Paris?":
                                     b'{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'})
    base = serve_app(create_app(make_runner(backend), ServerSettings(model_name="fake")))
    _chat_from_the_page(browser, base, "What is the weather in Paris?", WEATHER_TOOL)
    assert "finished: tool_calls" in _text(browser, ".message.assistant .stats")
    assert _text(browser, ".message.assistant .call") == 'call get_weather({"city": "Paris"})'


def test_the_page_shows_the_reasoning_apart(browser, make_runner, serve_app):
    backend = FakeBackend(num_slots=2, window=4096, n_batch=64,
                          replies={"<user>How many legs has a spider?<assistant>": f"<think>{THOUGHT}</think>Eight."})
    base = serve_app(create_app(make_runner(backend, tool_format="qwen3-xml"), ServerSettings(model_name="fake")))
    _chat_from_the_page(browser, base, "How many legs has a spider?")
    assert _text(browser, ".message.assistant .reasoning div") == THOUGHT
    assert _text(browser, ".message.assistant > div:not(.stats)") == "Eight."


@pytest.mark.model
def test_the_page_of_multiseq_serve_streams_a_real_models_answer(browser, start_cli):
    """The command itself, with the bundled model and a key: the page asks for the key, shows
    the model loaded, and a chat from its box streams SmolLM2's answer with its numbers."""
    import re
    import threading

    from helpers import read_until

    process = start_cli("serve", "-m", "smollm2-135m", "-np", "2", "-c", "2048", "--port", "0", "--no-dashboard",
                        "-t", "1", "--api-key", KEY)
    lines = read_until(process, "ready:")
    [page] = [match.group(1) for line in lines if (match := re.search(r"its page at (http://127\.0\.0\.1:\d+/)", line))]
    threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()
    browser.get(page)
    wait_until(lambda: browser.find_element("id", "key-form").is_displayed(), what="the key asked for")
    browser.find_element("id", "key").send_keys(KEY + "\n")
    wait_until(lambda: "smollm2-135m" in _text(browser, ".model-head") and "loaded" in _text(browser, ".model-head"),
               what="the model shown loaded")
    browser.find_element("id", "chat-max-tokens").clear()
    browser.find_element("id", "chat-max-tokens").send_keys("12")
    browser.find_element("id", "chat-input").send_keys("What is the capital of France?\n")
    wait_until(lambda: "finished" in _text(browser, ".message.assistant .stats"), timeout=60, what="the answer's end")
    assert _text(browser, ".message.assistant > div:not(.stats)").strip()
    assert "generated" in _text(browser, ".message.assistant .stats") and _page_errors(browser) == []

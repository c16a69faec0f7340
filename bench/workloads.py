"""The benchmark workloads: the same prompts and settings for every system measured.

Prompts are built deterministically from word lists, so every run and every system sees the
same text. Every request generates exactly `max_tokens` tokens (EOS ignored), so systems are
compared on the same amount of work.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

_TASKS = [
    "Write a short story about", "Explain to a child", "List five facts about", "Describe the history of",
    "Give three arguments for and against", "Write a poem about", "Summarize what is known about",
    "Compose a letter to a friend about",
]
_TOPICS = [
    "the ocean", "volcanoes", "the moon landing", "honey bees", "the printing press", "black holes",
    "a lighthouse keeper", "ancient Rome", "electric cars", "the water cycle", "chess", "mountain goats",
    "the first computers", "rain forests", "jazz music", "a lost umbrella",
]
_SENTENCE_PARTS = (
    ["The committee", "A young engineer", "The old library", "Every morning the baker", "The river",
     "Our small team", "The museum guide", "A curious cat", "The weather report", "The new bridge"],
    ["noticed", "described", "questioned", "rebuilt", "celebrated", "measured", "ignored", "explained",
     "painted", "followed"],
    ["the quiet harbor", "a list of forgotten recipes", "the northern hills", "an unusual signal",
     "the annual festival", "a broken clock", "the long winter", "a map of the city", "the village school",
     "a set of old letters"],
    ["before sunrise.", "with great care.", "for the third time.", "without any help.", "in the rain.",
     "during the meeting.", "after a long debate.", "while everyone watched.", "as the bells rang.",
     "near the station."],
)


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[str]  # raw text; for chat workloads, filled in per model from `chats`
    max_tokens: int
    sampling: dict = field(default_factory=dict)  # temperature, top_k, top_p, min_p, seed
    chats: list[tuple[dict, ...]] | None = None  # chat messages, rendered with each model's template

    @property
    def is_greedy(self) -> bool:
        return self.sampling.get("temperature", 0) == 0

    def rendered_for(self, render_chat) -> Workload:
        """The workload with its chats rendered to prompt text by a model's template, so that
        every system is sent the very same text."""
        if self.chats is None:
            return self
        return Workload(self.name, [render_chat(chat) for chat in self.chats], self.max_tokens, self.sampling,
                        self.chats)


def short_prompts(count: int) -> list[str]:
    """Distinct one-line instructions of roughly 8 to 16 tokens."""
    return [f"{_TASKS[index % len(_TASKS)]} {_TOPICS[(index * 7 + index // len(_TASKS)) % len(_TOPICS)]}."
            for index in range(count)]


def long_prompts(count: int, seed: int = 0) -> list[str]:
    """Distinct paragraphs of 22 to 45 sentences, about 200 to 400 tokens on these models,
    ending with an instruction."""
    rng = random.Random(seed)
    prompts = []
    for index in range(count):
        sentences = [" ".join(rng.choice(part) for part in _SENTENCE_PARTS) for _ in range(rng.randint(22, 45))]
        prompts.append(f"Notes, part {index + 1}: " + " ".join(sentences) + "\nSummarize these notes:")
    return prompts


_RULE_SUBJECTS = ["Crashes", "Wrong totals", "Slow pages", "Login problems", "Missing emails", "Broken exports",
                  "Requests for dark mode", "Requests for new reports", "Questions about invoices",
                  "Questions about passwords", "Data loss", "Layout glitches"]
_RULE_ACTIONS = ["are labelled bug with priority high", "are labelled bug with priority medium",
                 "are labelled feature and sent to the product team", "are labelled question and answered from the FAQ",
                 "are labelled bug and need the app version", "are labelled question unless the user reports an error"]
_TICKET_OPENINGS = ["Since this morning", "After the last update", "When I open the dashboard", "Every Monday",
                    "On my phone", "For two of our users", "Since we moved offices", "Right after login"]
_TICKET_PROBLEMS = ["the invoice totals are wrong by a few cents", "the export button does nothing",
                    "the page takes a minute to load", "I cannot reset my password",
                    "the app closes when I attach a photo", "we would like a weekly summary report",
                    "the emails never arrive", "the charts overlap the menu"]
_TICKET_ENDINGS = ["Can you help?", "Is this known?", "Please advise.", "Thanks in advance.", "This blocks our team.",
                   "Not urgent, but annoying."]


def triage_system_prompt() -> str:
    """A long instruction shared by every request (~480 tokens on these models)."""
    rules = [f"Rule {index + 1}: {subject} {_RULE_ACTIONS[index % len(_RULE_ACTIONS)]}."
             for index, subject in enumerate(_RULE_SUBJECTS)]
    guidance = ("Read the ticket carefully. Decide the label from the rules above, then explain your decision in "
                "one short sentence that quotes the part of the ticket that decided it. Never invent details that "
                "the ticket does not give. If two rules apply, the rule with the lower number wins. When the "
                "ticket is unclear, choose question and say what is missing. ")
    return ("You are the support triage assistant of a small software company. You label incoming tickets so "
            "that the right team sees them first. " + " ".join(rules) + " " + guidance * 3).strip()


def shared_prefix_chats(count: int, seed: int = 0) -> list[tuple[dict, ...]]:
    """Chats that share the long triage instruction and differ in a short ticket (~60 tokens)."""
    rng = random.Random(seed)
    system = {"role": "system", "content": triage_system_prompt()}
    chats = []
    for index in range(count):
        ticket = (f"Ticket {1000 + index} from customer {rng.randint(100, 999)}: {rng.choice(_TICKET_OPENINGS)} "
                  f"{rng.choice(_TICKET_PROBLEMS)}, and {rng.choice(_TICKET_OPENINGS).lower()} "
                  f"{rng.choice(_TICKET_PROBLEMS)}. We use the web app with {rng.randint(2, 40)} seats on the "
                  f"{rng.choice(['basic', 'team', 'business'])} plan. {rng.choice(_TICKET_ENDINGS)}")
        chats.append((system, {"role": "user", "content": ticket}))
    return chats


GREEDY = {"temperature": 0.0}
# min_p is set to 0 so that no system's own default (llama-server's is 0.05) changes the filter.
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.0, "seed": 1234}


def standard_workloads(num_prompts: int = 64) -> dict[str, Workload]:
    return {
        workload.name: workload
        for workload in (
            Workload("short-greedy", short_prompts(num_prompts), 128, GREEDY),
            Workload("short-sampled", short_prompts(num_prompts), 128, SAMPLED),
            Workload("long-greedy", long_prompts(num_prompts), 64, GREEDY),
            Workload("shared-prefix", [], 48, GREEDY, chats=shared_prefix_chats(num_prompts)),
        )
    }


_TOOL_NAMES = ["search_files", "read_file", "write_file", "run_tests", "list_directory", "git_diff", "git_commit",
               "open_issue", "query_database", "send_email", "fetch_calendar", "create_ticket", "summarize_log",
               "translate_text", "format_code", "lint_code", "deploy_preview", "rollback_release"]
_TOOL_PURPOSES = ["finds every file whose name or content matches a pattern", "returns the text of one file",
                  "replaces a file's content after showing the user the change", "runs the project's test suite",
                  "lists what a folder holds", "shows what changed since the last commit",
                  "records the staged changes with a message", "files a new issue in the tracker",
                  "runs a read-only SQL query", "sends a short email to a colleague"]
_TOOL_ARGUMENTS = ["path (string, required)", "pattern (string, required)", "limit (integer, default 20)",
                   "message (string, required)", "recursive (boolean, default false)", "timeout (seconds, default 60)"]
_AGENT_ASKS = ["Find where the configuration file is read and tell me which keys it expects",
               "Run the tests for the parser module and summarize what failed",
               "Read the changelog and list the three most recent changes",
               "Check whether the export function handles empty tables",
               "Open an issue about the slow start-up we saw yesterday",
               "Look at the last commit and explain what it changed and why",
               "Search the logs for timeouts and count how many there were this week",
               "Draft a short email to the team about the release date"]
_AGENT_DETAILS = ["The project lives in the usual folder and uses the standard layout.",
                  "Keep the answer short and say which tool you would call first.",
                  "If something is unclear, say what you would need to know.",
                  "We are in a hurry, so skip anything that is not essential.",
                  "Mention any risk you see before changing anything."]


def agent_system_prompt(approx_tokens: int = 1000) -> str:
    """A long agent instruction with tool descriptions, shared by every session: about
    `approx_tokens` tokens on these models (4.3 characters a token for this English)."""
    parts = ["You are a coding assistant working in a user's repository. You can call the tools below; "
             "describe the call you would make, then answer. Tools:"]
    index = 0
    while sum(len(part) + 1 for part in parts) < approx_tokens * 4.3:
        name = _TOOL_NAMES[index % len(_TOOL_NAMES)]
        parts.append(f"Tool {index + 1}, {name}{'' if index < len(_TOOL_NAMES) else f'_v{index // len(_TOOL_NAMES) + 1}'}: "
                     f"{_TOOL_PURPOSES[index % len(_TOOL_PURPOSES)]}. Arguments: "
                     f"{_TOOL_ARGUMENTS[index % len(_TOOL_ARGUMENTS)]}, {_TOOL_ARGUMENTS[(index + 3) % len(_TOOL_ARGUMENTS)]}.")
        index += 1
    return " ".join(parts)


def agent_user_messages(session: int, turns: int, seed: int = 0) -> list[str]:
    """One session's user messages, one per turn, about 60 tokens each."""
    rng = random.Random(seed * 1000 + session)
    return [f"Session {session + 1}, step {turn + 1}. {rng.choice(_AGENT_ASKS)}. {rng.choice(_AGENT_DETAILS)} "
            f"{rng.choice(_AGENT_DETAILS)} " + " ".join(rng.choice(part) for part in _SENTENCE_PARTS)
            for turn in range(turns)]


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_STRING = {"type": "string"}


def agent_tools(count: int = 10) -> list[dict]:
    """A coding agent's tools as OpenAI function specs: ten real ones, then numbered variants of
    them up to `count` (for the many-tools benchmark)."""
    base = [
        _function("read_file", "Read a file of the repository", {"path": _STRING}, ["path"]),
        _function("write_file", "Replace a file's content", {"path": _STRING, "content": _STRING}, ["path", "content"]),
        _function("search_files", "Find files whose content matches a pattern",
                  {"pattern": _STRING, "path": _STRING, "limit": {"type": "integer"}}, ["pattern"]),
        _function("list_directory", "List what a folder holds", {"path": _STRING, "recursive": {"type": "boolean"}},
                  ["path"]),
        _function("run_tests", "Run the project's tests", {"target": _STRING}, ["target"]),
        _function("run_command", "Run a shell command", {"command": _STRING, "timeout": {"type": "integer"}},
                  ["command"]),
        _function("git_diff", "Show what changed since the last commit", {"path": _STRING}, []),
        _function("git_commit", "Commit the staged changes", {"message": _STRING}, ["message"]),
        _function("open_issue", "File an issue in the tracker", {"title": _STRING, "body": _STRING}, ["title"]),
        _function("send_email", "Email a colleague", {"to": _STRING, "subject": _STRING, "body": _STRING},
                  ["to", "subject"]),
    ]
    tools = []
    for index in range(count):
        spec = base[index % len(base)]
        if index >= len(base):
            function = {**spec["function"], "name": f"{spec['function']['name']}_v{index // len(base) + 1}"}
            spec = {"type": "function", "function": function}
        tools.append(spec)
    return tools


def tool_result(name: str, turn: int) -> str:
    """What a tool "returned", short and fixed, so every system gets the same conversation."""
    return f"{name} finished (step {turn + 1}): 3 matches, no errors."

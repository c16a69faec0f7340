"""Result lines: one JSON object per input line, in the input file's format.

- jsonl and text input: multiseq's own result object per line; a line with n > 1 choices
  gets a `choices` list of such objects instead of one text.
- openai input: the OpenAI Batch API output format (openai_output.py), so tools that read
  those files read ours.

Where the lines go (and --errors) is output.py; reading them back for --resume is resume.py.
"""

from __future__ import annotations

from typing import Any

from ..sampling.logprobs import TokenLogprob
from ..request import Result
from .embeddings import embedding_values
from .openai_output import openai_record
from .reader import PromptFormat, PromptItem
from .resume import choice_succeeded


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def result_record(result: Result) -> dict[str, Any]:
    """A finished request as one JSON-ready object (the jsonl and text formats)."""
    timings = result.timings
    return {
        "id": result.id,
        "text": result.text,
        "finish_reason": result.finish_reason.value,
        # An output that ended but does not validate against its JSON schema is an error too.
        "error": result.error or result.schema_error,
        "prompt_tokens": result.prompt_tokens,
        "prompt_tokens_cached": result.prompt_tokens_cached,
        "prompt_tokens_from_ram": result.prompt_tokens_from_ram,
        "completion_tokens": result.completion_tokens,
        "truncated": result.truncated,
        "prompt_tokens_dropped": result.prompt_tokens_dropped,
        "tokens_shifted_out": result.tokens_shifted_out,
        "timings": {
            "queue_wait_s": _rounded(timings.queue_wait_s),
            "ttft_s": _rounded(timings.ttft_s),
            "prefill_tokens_per_s": _rounded(timings.prefill_tokens_per_s),
            "decode_tokens_per_s": _rounded(timings.decode_tokens_per_s),
            "total_s": _rounded(timings.total_s),
        },
        **({} if result.logprobs is None else {"logprobs": logprobs_record(result.logprobs)}),
        **({"approximated": list(result.approximated)} if result.approximated else {}),
        **_tool_fields(result),
        **({} if result.embedding is None else {"embedding": embedding_values(result.embedding)}),
    }


def _tool_fields(result: Result) -> dict[str, Any]:
    """With tools: the calls (OpenAI's shape), what the model reasoned, and why text that began
    a call could not be read as one; only the fields that say something."""
    fields: dict[str, Any] = {}
    if result.tool_calls:
        fields["tool_calls"] = [{"id": call.id, "type": "function",
                                 "function": {"name": call.name, "arguments": call.arguments}}
                                for call in result.tool_calls]
    if result.reasoning is not None:
        fields["reasoning"] = result.reasoning
    if result.tool_call_error is not None:
        fields["tool_call_error"] = result.tool_call_error
    return fields


def logprobs_record(logprobs: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    """Per output token: its id, text, bytes and log probability, and the top alternatives."""
    return [{"token": entry.text, "id": entry.token_id, "logprob": entry.logprob, "bytes": list(entry.token_bytes),
             "top_logprobs": [{"token": top.text, "id": top.token_id, "logprob": top.logprob,
                               "bytes": list(top.token_bytes)} for top in entry.top_logprobs]}
            for entry in logprobs]


def choices_record(item: PromptItem, results: list[Result]) -> dict[str, Any]:
    """A line with n > 1: the prompt once, each choice's result (without its id) by index, and
    an error naming the choices that failed (null when all succeeded)."""
    choices = []
    for index, result in enumerate(results):
        choice = result_record(result)
        del choice["id"]
        choices.append({"index": index, **choice})
    failed = [str(choice["index"]) for choice in choices if not choice_succeeded(choice)]
    error = None
    if failed:
        first = next(choice for choice in choices if not choice_succeeded(choice))
        error = f"choice {', '.join(failed)} did not finish: {first['error'] or first['finish_reason']}"
    return {"id": item.id, "n": len(results), "error": error, "prompt_tokens": results[0].prompt_tokens,
            "completion_tokens": sum(result.completion_tokens for result in results), "choices": choices}



def item_error_record(item: PromptItem) -> dict[str, Any]:
    """A line that could not run, in the same shape as a result; `param` names the field."""
    return {"id": item.id, "text": "", "finish_reason": "error", "error": item.error, "param": item.error_param,
            "line": item.line_number, "prompt_tokens": 0, "completion_tokens": 0}


def record_for(prompt_format: PromptFormat, item: PromptItem, results: list[Result] | None, model_name: str) -> dict:
    """The output line for an item and the results of its choices (None: it never ran), in the
    file's format."""
    if prompt_format is PromptFormat.OPENAI:
        return openai_record(item, results, model_name)
    if results is None:
        return item_error_record(item)
    if item.n > 1:
        return choices_record(item, results)
    return result_record(results[0]) | {"id": item.id}  # the runner may have run it under another id

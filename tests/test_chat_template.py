"""Chat templates: built-in names, Jinja text and files, rendering in a sandbox."""

from __future__ import annotations

import pytest

from multiseq.llama.chat_template import ChatTemplate, JinjaRenderer, load_chat_template

BUILTINS = ["chatml", "gemma", "llama3"]
CHAT = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
SIMPLE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
          "{% if add_generation_prompt %}[assistant]{% endif %}")


def test_a_builtin_name_goes_to_llama_cpp():
    assert load_chat_template("gemma", BUILTINS) == ChatTemplate("gemma", None, "llama.cpp's 'gemma' template")


def test_jinja_text_and_jinja_files_are_rendered_here(tmp_path):
    assert load_chat_template(SIMPLE, BUILTINS).jinja_source == SIMPLE
    path = tmp_path / "chatml"  # a file wins over a built-in name of the same spelling
    path.write_text(SIMPLE)
    template = load_chat_template(str(path), BUILTINS)
    assert template.llama_name is None and template.jinja_source == SIMPLE
    assert template.description == f"chat template file {path}"


@pytest.mark.parametrize("value, message", [
    ("chatlm", "unknown chat template 'chatlm': give a Jinja template file, or one of llama.cpp's built-in "
               "templates: chatml, gemma, llama3"),
    ("templates/mine.jinja", "chat template file not found: templates/mine.jinja"),
    ("{% for %}", "the chat template text does not compile: line 1:"),
])
def test_what_is_not_a_template_says_why(value, message):
    with pytest.raises(ValueError) as error:
        load_chat_template(value, BUILTINS)
    assert str(error.value).startswith(message)


def test_a_template_file_that_is_not_utf8_says_so(tmp_path):
    path = tmp_path / "latin1.jinja"
    path.write_bytes("{{ 'café' }}".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        load_chat_template(str(path), BUILTINS)


def test_rendering_sees_messages_the_generation_prompt_and_special_tokens():
    renderer = JinjaRenderer(SIMPLE + "{{ eos_token }}", "t", "<s>", "</s>", add_bos=False)
    assert renderer.render(CHAT) == "<s>[system] Be brief.\n[user] Hi\n[assistant]</s>"


def test_a_bos_the_tokenizer_adds_is_not_rendered_twice():
    assert JinjaRenderer(SIMPLE, "t", "<s>", "</s>", add_bos=True).render(CHAT[1:]) == "[user] Hi\n[assistant]"


def test_a_template_that_refuses_or_breaks_is_a_value_error_naming_it():
    refusing = JinjaRenderer("{{ raise_exception('only user messages') }}", "chat template file x.jinja", "", "",
                             add_bos=False)
    with pytest.raises(ValueError, match="chat template file x.jinja failed: only user messages"):
        refusing.render(CHAT)
    escaping = JinjaRenderer("{{ messages.__class__.__mro__ }}", "t", "", "", add_bos=False)
    with pytest.raises(ValueError, match="t failed"):
        escaping.render(CHAT)


@pytest.mark.model
def test_a_gguf_template_llama_cpp_does_not_know_is_rendered_with_jinja(smollm, monkeypatch):
    monkeypatch.setattr(smollm, "chat_template", ChatTemplate.embedded(SIMPLE))
    monkeypatch.setattr(smollm, "_jinja", None)
    assert smollm.render_chat(CHAT[1:]) == "<|im_start|>[user] Hi\n[assistant]"
    monkeypatch.setattr(smollm, "chat_template", ChatTemplate.builtin("llama3"))
    assert smollm.render_chat(CHAT[1:]).startswith("<|start_header_id|>user<|end_header_id|>")

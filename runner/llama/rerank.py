"""A query and a document as one input of a reranker, laid out as llama-server lays them out
(tools/server's format_prompt_rerank), so that a reranker's scores are the ones it gives there.

A GGUF may carry a "rerank" chat template (Qwen3-Reranker's does): its {query} and {document}
are filled in and special tokens parsed. Otherwise the pair is a cross-encoder's: BOS (if the
vocabulary adds one), the query, EOS (or SEP where there is no EOS) if the vocabulary adds one,
SEP if it adds one, the document, EOS again (bge-reranker's `<s> query </s></s> document </s>`,
a BERT's `[CLS] query [SEP] document [SEP]`)."""

from __future__ import annotations

from typing import Callable

_NO_TOKEN = -1  # LLAMA_TOKEN_NULL


class RerankLayout:
    """How a vocabulary joins a query and a document into one reranker input."""

    def __init__(self, llama, vocab, tokenize: Callable[..., list[int]], template: str | None) -> None:
        self._tokenize = tokenize
        self.template = template
        eos = llama.llama_vocab_eos(vocab)
        if eos == _NO_TOKEN:
            eos = llama.llama_vocab_sep(vocab)
        self._bos = [llama.llama_vocab_bos(vocab)] if llama.llama_vocab_get_add_bos(vocab) else []
        self._eos = [eos] if llama.llama_vocab_get_add_eos(vocab) and eos != _NO_TOKEN else []
        self._sep = [llama.llama_vocab_sep(vocab)] if llama.llama_vocab_get_add_sep(vocab) else []

    def tokens(self, query: str, document: str) -> list[int]:
        if self.template is not None:
            text = self.template.replace("{query}", query).replace("{document}", document)
            return self._tokenize(text, add_special=False, parse_special=True)
        query_tokens = self._tokenize(query, add_special=False, parse_special=False)
        document_tokens = self._tokenize(document, add_special=False, parse_special=False)
        return [*self._bos, *query_tokens, *self._eos, *self._sep, *document_tokens, *self._eos]


def rerank_template(llama, model_handle) -> str | None:
    """The GGUF's "rerank" chat template (tokenizer.chat_template.rerank), if it has one."""
    template = llama.llama_model_chat_template(model_handle, b"rerank")
    return template.decode("utf-8", "replace") if template else None

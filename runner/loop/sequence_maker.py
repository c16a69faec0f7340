"""Requests into sequences: a request's prompt rendered (its chat with its tools) and tokenized,
fitted to the slot window, with its sampler, its compiled constraint and its output's reader.
Reads only the model and the config, so it may run on any thread (the Runner's intake does)."""

from __future__ import annotations

import hashlib
import os
import warnings

import numpy as np

from ..llama.batch import Backend
from ..llama.media import MEDIA_MARKER
from ..config import CONTEXT_POOLINGS, DEFAULT_POOLING, RANK, OverflowPolicy, RunnerConfig
from ..sampling.grammar import TokenConstraint
from ..request import Request
from ..sampling.budget import ReasoningBudget
from ..sampling.sampler import SequenceSampler
from .pooling import PooledEmbedding
from .scheduler import fit_prompt
from .sequence import Sequence
from ..tools.support import ToolSupport


class SequenceMaker:
    """Makes the Sequence of a request (see the module's docstring)."""

    def __init__(self, config: RunnerConfig, backend: Backend, tools: ToolSupport, window: int) -> None:
        self.config = config
        self.backend = backend
        self.tools = tools
        self.window = window
        self._base_seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(8), "little")
        # How embedding requests pool by default: the config's, else as the GGUF says, else mean.
        model_pooling = backend.model_pooling
        self.pooling = config.pooling or (model_pooling if model_pooling in CONTEXT_POOLINGS else "mean")
        self.ranks = backend.ranks
        self.embeds_whole = backend.embeds_whole
        # A step's token budget keeps streams flowing beside long prompts; a model that does not
        # generate (an encoder, a reranker) has no streams, and fills every decode instead.
        self.step_tokens = None if self.embeds_whole else config.step_tokens

    def new_sequence(self, request: Request, request_id: str, streams: bool = False) -> Sequence:
        """Tokenize and fit a request (streams: its pieces are watched as they come). Reads only
        the model and the config, so it may run on any thread; raises ValueError or
        BackendError when this request cannot run."""
        params = request.sampling
        text = self.prompt_text(request)
        media = request.all_media
        if media:
            return self._media_sequence(request, request_id, text, media, streams)
        tokens = self._tokens_of(request, text)
        if not tokens:
            raise ValueError("the prompt tokenizes to no tokens")
        if request.embed is not None:
            return self._embedding_sequence(request, request_id, tokens)
        if self.ranks:
            raise ValueError("the model is used as a reranker (pooling rank): it scores a query with documents "
                             "(/v1/rerank), it does not generate")
        if self.embeds_whole:
            raise ValueError("the model is an encoder (its attention sees the whole input, as a BERT's): it embeds, "
                             "it does not generate")
        bos_kept = 1 if self.backend.add_bos else 0
        n_keep = (request.n_keep if request.n_keep is not None else self.config.n_keep) + bos_kept
        overflow = request.overflow or self.config.overflow
        fit = fit_prompt(tokens, self.window, n_keep, params.max_tokens, overflow)
        if params.prompt_logprobs is not None and fit.num_dropped:
            raise ValueError(f"a scored prompt (echo with logprobs) must fit the slot's {self.window}-token window "
                             f"with its output; it has {len(tokens)} tokens")
        return self._generating_sequence(request, request_id, text, fit, n_keep, overflow, streams=streams)

    def _generating_sequence(self, request: Request, request_id: str, text: str, fit, n_keep: int,
                             overflow: OverflowPolicy, media_spans: tuple = (), streams: bool = False) -> Sequence:
        params = request.sampling
        seed = params.seed if params.seed is not None else self._derive_seed(request_id)
        banned = self.backend.end_of_generation_tokens() if params.ignore_eos else ()
        banned_early = self.backend.end_of_generation_tokens() if params.min_tokens and not banned else ()
        sampler = SequenceSampler(params, seed, fit.tokens, banned, self._constraint(request, text),
                                  self.backend.token_bytes, banned_early, self._reasoning_budget(request, text))
        return Sequence(request_id, fit.tokens, sampler, n_keep, overflow, fit.max_tokens,
                        prompt_tokens_dropped=fit.num_dropped, priority=request.priority,
                        tool_parser=self.tools.parser(request, text), media_spans=media_spans, streams=streams,
                        adapter=self._adapter_of(request))

    def _media_sequence(self, request: Request, request_id: str, text: str, media: list[bytes],
                        streams: bool) -> Sequence:
        """A prompt with images or audio: cut into text and media by the model's projector, and
        never slid (a medium cut in two is not the medium): one that does not fit its window,
        with room to generate, is refused, as is one whose output must end within it."""
        if request.embed is not None or request.sampling.prompt_logprobs is not None:
            raise ValueError("a prompt with media gives a generated answer only: no embedding, no prompt log "
                             "probabilities")
        prompt = self._media_prompt(text, media)
        if prompt.spans and prompt.spans[-1].end == len(prompt.tokens):
            raise ValueError("the prompt ends with a medium: text must follow it (the model's answer starts from "
                             "a text token)")
        # (a causal medium larger than a decode is decoded in pieces; one read both ways cannot be)
        too_long = next((span for span in prompt.spans
                         if not span.media.decodable_within(self.backend.n_batch)), None)
        if too_long is not None:
            raise ValueError(f"a medium takes {too_long.media.num_tokens} tokens, more than one llama_decode holds "
                             f"(-b/--batch-size {self.backend.n_batch}), and its tokens attend to each other both "
                             f"ways: it is decoded whole")
        fit = fit_prompt(prompt.tokens, self.window, 0, request.sampling.max_tokens, OverflowPolicy.REJECT)
        return self._generating_sequence(request, request_id, text, fit, 0, OverflowPolicy.REJECT, prompt.spans,
                                         streams)

    def _reasoning_budget(self, request: Request, prompt: str) -> ReasoningBudget | None:
        """The reasoning of a chat whose reasoning is read apart (its tokens counted, its budget
        kept; None: the model does not reason, or the request is no chat)."""
        markers = self.tools.family.reasoning
        if not self.tools.reasons or markers is None or request.messages is None:
            return None
        params, config = request.sampling, self.config
        budget = params.reasoning_budget if params.reasoning_budget is not None else config.reasoning_budget
        message = (params.reasoning_budget_message if params.reasoning_budget_message is not None
                   else config.reasoning_budget_message)
        forced = self.backend.tokenize(message + markers[1], add_special=False) if budget >= 0 else []
        marker_bytes = {token: text.encode("utf-8") for text, token in self.tools.special_markers.items()}
        # The template's text after its opener ("<think>\n"); none where the prompt opened the block
        # otherwise (Kimi K3's <|open|>think<|sep|>) and an earlier "<think>" is only text.
        opened = prompt.rfind(markers[0])
        after_opener = prompt[opened + len(markers[0]):] if opened >= 0 else ""
        after_opener = after_opener if not after_opener.strip() else ""
        return ReasoningBudget(budget, markers, forced, self.tools.family.opens_reasoning(prompt),
                               lambda token: marker_bytes.get(token) or self.backend.token_bytes(token),
                               len(self.backend.tokenize(after_opener, add_special=False)) if after_opener else 0)

    def _adapter_of(self, request: Request) -> int:
        """The adapter set a request's steps run through: 1 + its lora_modules entry (0: none)."""
        if request.adapter is None:
            return 0
        names = [name for name, _, _ in self.config.lora_modules]
        if request.adapter not in names:
            raise ValueError(f"no LoRA adapter is named {request.adapter!r} here"
                             + (f" (there are {', '.join(names)})" if names else " (the runner has none)"))
        return 1 + names.index(request.adapter)

    def _embedding_sequence(self, request: Request, request_id: str, tokens: list[int]) -> Sequence:
        """An embedding request's sequence: its whole prompt in one window (an embedding of a
        part would not be the text's), nothing sampled."""
        if len(tokens) > self.window:
            raise ValueError(f"the input has {len(tokens)} tokens, more than a slot's {self.window}-token window")
        pooling = self.pooling if request.embed == DEFAULT_POOLING else request.embed
        self._check_pooling(pooling, len(tokens))
        sampler = SequenceSampler(request.sampling, 0, tokens, (), None, self.backend.token_bytes)
        return Sequence(request_id, tokens, sampler, 0, OverflowPolicy.REJECT, 1, priority=request.priority,
                        embedding=PooledEmbedding(pooling, len(tokens), whole=self.embeds_whole))

    def _check_pooling(self, pooling: str, num_tokens: int) -> None:
        """Whether this context can pool an input so: a reranker's context only ranks, and ranking
        needs one; an input pooled whole fits one llama_decode."""
        if self.ranks and pooling != RANK:
            raise ValueError("the model is used as a reranker (pooling rank): it gives scores (/v1/rerank), not "
                             "embeddings; start it with --pooling mean, cls or last for embeddings")
        if pooling == RANK and not self.ranks:
            raise ValueError("ranking needs a reranker's context: start the model with --pooling rank (a reranker's "
                             "GGUF says rank itself)")
        if self.embeds_whole and num_tokens > self.backend.n_batch:
            raise ValueError(f"the input has {num_tokens} tokens; this model computes an input whole in one "
                             f"llama_decode, at most -b/--batch-size ({self.backend.n_batch}) tokens")

    def prompt_text(self, request: Request) -> str:
        """A request's prompt as text (its chat rendered with its tools; "" for token ids)."""
        if isinstance(request.prompt, tuple):
            return ""
        return request.prompt if request.prompt is not None else self.tools.render(self.backend, request)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The tokens a request's prompt comes to (its chat rendered with its tools; a medium as
        the placeholders that stand for it). Reads only the model, so it may run on any thread."""
        media = request.all_media
        if media:
            return self._media_prompt(self.prompt_text(request), media).tokens
        return self._tokens_of(request, self.prompt_text(request))

    def _media_prompt(self, text: str, media: list[bytes]):
        """The prompt text (a MEDIA_MARKER where each medium stands) cut and tokenized by the
        projector; ValueError where the template did not write each medium once."""
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) != len(media) + 1:
            raise ValueError(f"the chat template wrote {len(pieces) - 1} of the request's {len(media)} media into the "
                             f"prompt; it must write each once")
        return self.backend.tokenize_media(pieces, media)

    def _tokens_of(self, request: Request, text: str) -> list[int]:
        if not isinstance(request.prompt, tuple):
            return self.backend.tokenize(text)
        outside = next((token for token in request.prompt if token >= self.backend.n_vocab), None)
        if outside is not None:
            raise ValueError(f"prompt token {outside} is not in the vocabulary (0 to {self.backend.n_vocab - 1})")
        return list(request.prompt)

    def _constraint(self, request: Request, prompt: str = "") -> TokenConstraint | None:
        """The request's compiled constraint (its schema or grammar, or the grammar of its tool
        calls); raises ValueError when it cannot be compiled (a constrained request never runs
        without its constraint). Token ids of the logit bias are checked here too, where the
        vocabulary is known."""
        params = request.sampling
        too_large = sorted(token for token in params.logit_bias or {} if token >= self.backend.n_vocab)
        if too_large:
            raise ValueError(f"logit_bias names token {too_large[0]}, but the vocabulary has "
                             f"{self.backend.n_vocab} tokens")
        tool_grammar = self.tools.grammar(request, prompt)
        if tool_grammar is not None and params.is_constrained:
            raise ValueError("a JSON schema or grammar cannot constrain an output that may call tools: give "
                             "tool_choice 'none', or leave out the schema")
        if not params.is_constrained and tool_grammar is None:
            return None
        return TokenConstraint(self.backend.grammar_tokenizer(), params, tool_grammar)

    def _derive_seed(self, request_id: str) -> int:
        """A request without a seed gets one from the runner's seed and its id, so a run with a
        fixed runner seed samples the same text for the same id, in any order."""
        digest = hashlib.blake2b(request_id.encode("utf-8"), digest_size=8).digest()
        state = np.random.SeedSequence([self._base_seed, int.from_bytes(digest, "little")]).generate_state(2, np.uint32)
        return int(state[0]) | (int(state[1]) << 32)

    def clamped_n_discard(self) -> int:
        """The config's n_discard, below the window (a warning says so where it was not)."""
        n_discard = self.config.n_discard
        if n_discard >= self.window:
            clamped = self.window - 1
            warnings.warn(f"n_discard={n_discard} is not below the {self.window}-token slot window; using {clamped}",
                          stacklevel=4)
            return clamped
        return n_discard

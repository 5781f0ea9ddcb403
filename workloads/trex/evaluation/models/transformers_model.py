"""A local Hugging Face checkpoint directory: AutoModelForCausalLM + tokenizer + its chat template."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from trex.llm.client import ChatResult, Usage
from trex.prompt_contract import REASONING_TOKENS
from trex.reasoning import CONTEXT_LIMITS, template_mode
from trex.verify.items import Item


def render_chat(tokenizer: Any, messages: list[dict[str, str]], reasoning_mode: str | None = None) -> str:
    """The tokenizer's chat template when it has one (a reasoning mode passed as ``reasoning_mode``, the
    prompt contract's template, and ``thinking``, DeepSeek's), else a plain role-tagged transcript."""
    if getattr(tokenizer, "chat_template", None):
        kw = {} if reasoning_mode is None else {"reasoning_mode": reasoning_mode,
                                                "thinking": reasoning_mode != "non-think"}
        text: str = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
        return text
    if reasoning_mode is not None:
        raise ValueError("evaluation.reasoningMode: the model's tokenizer has no chat template to render it")
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


class TransformersModel:
    """Greedy (temperature 0) or sampled generation on CPU or the first accelerator; one at a time."""

    def __init__(self, path: str | Path, *, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 1024, seed: int = 0, device: str | None = None,
                 name: str | None = None, reasoning_mode: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        p = Path(path)
        if not (p / "config.json").is_file():
            raise ValueError(f"model path {str(path)!r} has no config.json (expected a Hugging Face checkpoint dir)")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(p)
        missing = [t for t in REASONING_TOKENS if t not in self.tokenizer.get_vocab()]
        if reasoning_mode is not None and missing:
            raise ValueError(f"evaluation.reasoningMode: the tokenizer of {path} has no {' '.join(missing)} tokens "
                             "(a trex model learns them with data.reasoningMode)")
        dtype = torch.bfloat16 if device != "cpu" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(p, torch_dtype=dtype)
        self.model: Any = model.to(device).eval()  # type: ignore[arg-type]
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.seed = max_new_tokens, seed
        self.name = name or f"transformers:{p.name}"
        self.reasoning_mode = reasoning_mode
        self._lock = threading.Lock()

    def generate_sync(self, messages: list[dict[str, str]], sample_index: int = 0) -> ChatResult:
        """Blocking generation (serialised: one forward pass stream per model)."""
        import torch

        with self._lock:
            t0 = time.perf_counter()
            prompt = render_chat(self.tokenizer, messages, template_mode(self.reasoning_mode))
            enc = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(self.device)
            n_prompt = int(enc["input_ids"].shape[1])
            budget = self.max_new_tokens
            if self.reasoning_mode is not None:  # the mode's context holds prompt and completion
                budget = min(budget, CONTEXT_LIMITS[self.reasoning_mode] - n_prompt)
                if budget <= 0:
                    return ChatResult("", Usage(n_prompt, 0), time.perf_counter() - t0, "length")
            gen_kwargs: dict[str, Any] = {"max_new_tokens": budget}
            if self.temperature > 0:
                torch.manual_seed(self.seed + sample_index)
                gen_kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p)
            else:
                gen_kwargs.update(do_sample=False)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
            with torch.inference_mode():
                out = self.model.generate(**enc, pad_token_id=pad, **gen_kwargs)
            new = out[0, enc["input_ids"].shape[1]:]
            text = self._decode(new.tolist())
            eos = self.tokenizer.eos_token_id
            ended = len(new) < budget or (eos is not None and int(new[-1]) == eos)
            finish = "stop" if ended else "length"
            usage = Usage(n_prompt, len(new))
            return ChatResult(text, usage, time.perf_counter() - t0, finish)

    def _decode(self, ids: list[int]) -> str:
        """Completion text without special tokens, except the think tags of a reasoning mode (answer_of
        splits the answer off at </think>)."""
        if self.reasoning_mode is None:
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))
        keep = {self.tokenizer.convert_tokens_to_ids(t) for t in REASONING_TOKENS}
        special = set(self.tokenizer.all_special_ids) | set(self.tokenizer.added_tokens_decoder)
        return str(self.tokenizer.decode([i for i in ids if i in keep or i not in special],
                                         skip_special_tokens=False))

    async def generate(self, messages: list[dict[str, str]], *, item: Item, sample_index: int) -> ChatResult:
        """Generation on a worker thread so the event loop keeps executing programs meanwhile."""
        return await asyncio.to_thread(self.generate_sync, messages, sample_index)

    async def aclose(self) -> None:
        """Drop the weights."""
        self.model = None

"""Models under evaluation: ``openai`` (any OpenAI-compatible endpoint), ``transformers`` (a local
Hugging Face directory), ``trex-checkpoint`` (a TrainJob checkpoint's HF export) and ``reference``
(the benchmark's own ground truth, a self-check of the harness)."""

from __future__ import annotations

import os

from trex.evaluation.config import ModelSpec, SamplingConfig
from trex.evaluation.models.base import Model
from trex.evaluation.models.reference import ReferenceModel
from trex.reasoning import template_mode

__all__ = ["Model", "ReferenceModel", "build_model", "parse_model_arg"]


def parse_model_arg(text: str) -> ModelSpec:
    """``openai:URL#MODEL`` | ``transformers:DIR`` | ``trex-checkpoint:DIR`` | ``reference`` -> ModelSpec."""
    if text == "reference":
        return ModelSpec(kind="reference")
    kind, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"--model {text!r}: expected openai:URL#MODEL, transformers:DIR, trex-checkpoint:DIR "
                         "or reference")
    if kind == "openai":
        url, hash_, name = rest.rpartition("#")
        if not hash_ or not url or not name:
            raise ValueError(f"--model {text!r}: expected openai:URL#MODEL (e.g. openai:http://host:8000/v1#qwen)")
        return ModelSpec(kind="openai", url=url, name=name)
    if kind == "transformers":
        return ModelSpec(kind="transformers", path=rest)
    if kind == "trex-checkpoint":
        return ModelSpec(kind="trex-checkpoint", path=rest)
    raise ValueError(f"--model {text!r}: unknown kind {kind!r} (openai, transformers, trex-checkpoint, reference)")


def build_model(spec: ModelSpec, *, request_timeout_s: float = 300.0, reasoning_mode: str | None = None) -> Model:
    """Instantiate the model a spec describes (heavy imports happen here, not at import time); a reasoning
    mode goes to the chat template (think-max's prompt is already in the messages, so it renders as
    think-high) and bounds a local model's context (prompt + completion) to the mode's limit."""
    s: SamplingConfig = spec.sampling
    mode = template_mode(reasoning_mode)
    if spec.kind == "reference":
        return ReferenceModel()
    if spec.kind == "openai":
        from trex.evaluation.models.openai_model import OpenAIModel
        from trex.llm.client import ChatClient

        if not spec.url or not spec.name:
            raise ValueError("model.url and model.name are required for kind 'openai'")
        key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        if spec.api_key_env and not key:
            raise ValueError(f"model.apiKeyEnv: environment variable {spec.api_key_env} is not set")
        client = ChatClient(spec.url, spec.name, key, timeout_s=request_timeout_s, retries=spec.retries,
                            seed=s.seed, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                            concurrency=spec.concurrency,
                            extra_body=None if mode is None else {"chat_template_kwargs": {
                                "thinking": mode != "non-think", "reasoning_mode": mode}})
        return OpenAIModel(client)
    assert spec.path is not None
    if spec.kind == "transformers":
        from trex.evaluation.models.transformers_model import TransformersModel

        return TransformersModel(spec.path, temperature=s.temperature, top_p=s.top_p,
                                 max_new_tokens=s.max_tokens, seed=s.seed, reasoning_mode=reasoning_mode)
    from trex.evaluation.models.checkpoint import load_checkpoint_model

    return load_checkpoint_model(spec.path, temperature=s.temperature, top_p=s.top_p,
                                 max_new_tokens=s.max_tokens, seed=s.seed, reasoning_mode=reasoning_mode)

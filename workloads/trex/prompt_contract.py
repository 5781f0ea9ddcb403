"""The one prompt contract between ORData, training and evaluation: chat layout, prompts and answer layout.

Everything that talks to a model builds its messages here, so the text a model is trained on (ORData's
SFT and CPT renderings) and the text it is evaluated with (`trex eval`) can never drift apart:

* the chat layout (``<|bos|>`` then ``<|role|>content<|end|>`` per message, ``<|assistant|>`` opens the
  answer), written once as the exported Hugging Face chat template and used by the trainer's packing;
* named, versioned prompt sets: a system prompt, a user-turn wrapper around the question and the answer
  contract (one ```python block that prints ``TREX_RESULT {"status", "objective", "values"}`` last).
  ``trex`` is the project's own set (ORData trains on it, the ``strict`` protocol evaluates with it);
  ``orlm``, ``sirl``, ``mamo`` and ``optibench`` reproduce the framing of those published harnesses;
* the answer layout ORData's reference answers follow: formulation, program, optimal objective.

:data:`CONTRACT_VERSION` changes whenever any text here changes; SFT manifests and eval reports record it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

CONTRACT_VERSION = "3"
"""Version of every text below (prompt sets, answer layout, chat layout)."""

DEFAULT_SET = "trex"

BOS, EOS, END, PAD = "<|bos|>", "<|eos|>", "<|end|>", "<|pad|>"
ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, *(f"<|{r}|>" for r in ROLES), END)
"""Specials every trainer tokenizer has (ids 0..6 when trained here): padding, document bounds, chat roles."""
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_TOKENS: tuple[str, ...] = (THINK_OPEN, THINK_CLOSE)
"""Specials of the reasoning modes (:mod:`trex.reasoning`; ids 7, 8 when trained here for a run with a reasoning
mode, which alone needs them)."""

DSML = "｜DSML｜"
CALLS_OPEN, CALLS_CLOSE = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"
INVOKE_OPEN, INVOKE_CLOSE = f"<{DSML}invoke", f"</{DSML}invoke>"
PARAM_OPEN, PARAM_CLOSE = f"<{DSML}parameter", f"</{DSML}parameter>"
RESULT_OPEN, RESULT_CLOSE = "<tool_result>", "</tool_result>"
TOOLS_INTRO = (
    "## Tools\n\nTo call tools, end the answer with one block of this form (any number of invokes, any number of "
    f"parameters each):\n\n{CALLS_OPEN}\n{INVOKE_OPEN} name=\"TOOL\">\n"
    f"{PARAM_OPEN} name=\"PARAMETER\" string=\"true\">a string, written as is{PARAM_CLOSE}\n"
    f"{PARAM_OPEN} name=\"PARAMETER\" string=\"false\">a JSON number, boolean, array or object{PARAM_CLOSE}\n"
    f"{INVOKE_CLOSE}\n{CALLS_CLOSE}\n\nWith thinking on, reason inside {THINK_OPEN}...{THINK_CLOSE} before any "
    f"call. Results come back as {RESULT_OPEN}...{RESULT_CLOSE}.\n\n### Tool schemas\n\n")
"""The system-prompt section a message's ``tools`` add (then one JSON schema per line): DeepSeek-V4's DSML
tool-call format (:mod:`trex.reasoning`)."""


def _lit(text: str) -> str:
    """``text`` as a Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


_TEMPLATE = r"""
{%- set mode = reasoning_mode if reasoning_mode is defined and reasoning_mode else '' -%}
{%- if mode and mode not in ['non-think', 'think-high', 'think-max'] -%}
  {{- raise_exception('reasoning_mode must be non-think, think-high or think-max') -}}
{%- endif -%}
{%- set tmp = think_max_prompt if mode == 'think-max' and think_max_prompt is defined and think_max_prompt else '' -%}
{%- if mode == 'think-max' and not tmp -%}
  {{- raise_exception('think_max_prompt is required for reasoning_mode think-max') -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1, tools=false) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
  {%- if m.role == 'tool' or m.tools or m.tool_calls -%}{%- set ns.tools = true -%}{%- endif -%}
  {%- if m.role not in ['system', 'user', 'assistant', 'tool'] -%}
    {{- raise_exception('role ' ~ m.role ~ ' is not one of system, user, assistant, tool') -}}
  {%- endif -%}
{%- endfor -%}
{%- if ns.tools and not mode -%}
  {{- raise_exception('tools, tool calls and tool results need a reasoning_mode') -}}
{%- endif -%}
{{- @BOS@ -}}
{%- if tmp and (not messages or messages[0].role != 'system') -%}{{- '<|system|>' + tmp + @END@ -}}{%- endif -%}
{%- for m in messages -%}
  {%- if m.role == 'tool' -%}
    {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|user|>' -}}{%- else -%}{{- '\n\n' -}}{%- endif -%}
    {{- @RESULT_OPEN@ + (m.content or '') + @RESULT_CLOSE@ -}}
    {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- @END@ -}}{%- endif -%}
  {%- elif m.role == 'assistant' -%}
    {{- '<|assistant|>' -}}
    {%- if mode and mode != 'non-think' and (ns.tools or loop.index0 > ns.last_user) -%}
      {{- @THINK_OPEN@ + (m.reasoning_content or '') + @THINK_CLOSE@ -}}
    {%- elif mode -%}
      {{- @THINK_CLOSE@ -}}
    {%- endif -%}
    {{- m.content or '' -}}
    {%- if m.tool_calls -%}
      {{- '\n\n' + @CALLS_OPEN@ + '\n' -}}
      {%- for c in m.tool_calls -%}
        {%- set f = c.function if c.function is defined and c.function else c -%}
        {%- if f.arguments is string -%}
          {{- raise_exception('tool call arguments must be an object, not JSON text') -}}
        {%- endif -%}
        {{- @INVOKE_OPEN@ + ' name="' + f.name + '">\n' -}}
        {%- for k, v in (f.arguments or {}).items() -%}
          {{- @PARAM_OPEN@ + ' name="' + k + '" string="' + ('true' if v is string else 'false') + '">'
              + (v if v is string else v | tojson) + @PARAM_CLOSE@ + '\n' -}}
        {%- endfor -%}
        {{- @INVOKE_CLOSE@ + '\n' -}}
      {%- endfor -%}
      {{- @CALLS_CLOSE@ -}}
    {%- endif -%}
    {{- @END@ -}}
  {%- else -%}
    {%- set body = (tmp if loop.first and m.role == 'system' else '') + (m.content or '') -%}
    {{- '<|' + m.role + '|>' + body -}}
    {%- if m.role == 'system' and m.tools -%}
      {{- ('\n\n' if body else '') + @TOOLS_INTRO@ -}}
      {%- for t in m.tools -%}{{- ('' if loop.first else '\n') + t | tojson(sort_keys=True) -}}{%- endfor -%}
    {%- endif -%}
    {{- @END@ -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|assistant|>' -}}
  {%- if mode -%}{{- @THINK_CLOSE@ if mode == 'non-think' else @THINK_OPEN@ -}}{%- endif -%}
{%- endif -%}
"""
_SLOTS = {"BOS": BOS, "END": END, "THINK_OPEN": THINK_OPEN, "THINK_CLOSE": THINK_CLOSE, "CALLS_OPEN": CALLS_OPEN,
          "CALLS_CLOSE": CALLS_CLOSE, "INVOKE_OPEN": INVOKE_OPEN, "INVOKE_CLOSE": INVOKE_CLOSE,
          "PARAM_OPEN": PARAM_OPEN, "PARAM_CLOSE": PARAM_CLOSE, "RESULT_OPEN": RESULT_OPEN,
          "RESULT_CLOSE": RESULT_CLOSE, "TOOLS_INTRO": TOOLS_INTRO}


def _chat_template() -> str:
    """The template with every @SLOT@ replaced by its constant as a Jinja literal."""
    out = _TEMPLATE.strip()
    for k, v in _SLOTS.items():
        out = out.replace(f"@{k}@", _lit(v))
    return out


CHAT_TEMPLATE = _chat_template()
"""Jinja chat template of the Hugging Face export (as transformers renders templates: its ``tojson``):
the plain layout, or with ``reasoning_mode`` (and ``think_max_prompt``) passed to ``apply_chat_template``
exactly the text :func:`trex.reasoning.render_text` produces, tools, DSML tool calls (arguments as objects)
and tool results included; the trainer's SFT packing produces the same tokens."""


def role_token(role: str) -> str:
    """The special token that opens a ``role`` turn."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    return f"<|{role}|>"


# --- prompt sets --------------------------------------------------------------------------------------
_RESULT_LINE = ('TREX_RESULT {{"status": STATUS, "objective": VALUE, "values": {{...}}}}\n'
                '(print "TREX_RESULT " followed by json.dumps of the dict). STATUS is the solver\'s outcome, one of\n'
                '"optimal", "infeasible", "unbounded" or "infeasible_or_unbounded"; VALUE is the optimal objective\n'
                'value as a number (null unless optimal).')

TREX_CONTRACT = ("Answer with the formulation, then one complete Python program in a single ```python block "
                 "that uses gurobipy (or highspy), solves the model and prints as its LAST line:\n"
                 + _RESULT_LINE + "{values}")

PUBLISHED_CONTRACT = ("Write one complete Python program in a single ```python code block. Use gurobipy (or highspy).\n"
                      "The program must build and solve the model, then print as the LAST line of its output:\n"
                      + _RESULT_LINE + "{values}")

NAMED = """
"values" must contain these keys exactly as written, each with its optimal numeric value:
{names}"""

DATA_FILE = """
The parameters are in the file "data.json" in the working directory: read them with json.load and
do not hard-code them. Before optimizing, write the instantiated model to "model.lp" in the working
directory: model.write("model.lp") with gurobipy, or h.writeModel("model.lp") with highspy."""


@dataclass(frozen=True)
class PromptSet:
    """A system prompt and a user-turn template with ``{question}`` and ``{contract}`` slots."""

    name: str
    system: str
    user: str
    contract: str


_TREX_SYSTEM = ("You are an expert in operations research. Formulate the problem precisely (variables, objective, "
                "constraints) and write a correct, runnable Python program that solves it.")
_PUBLISHED_SYSTEM = ("You are an expert in operations research and mathematical optimization. You formulate problems "
                     "precisely and write correct, runnable Python solver code.")

PROMPT_SETS: dict[str, PromptSet] = {
    "trex": PromptSet("trex", _TREX_SYSTEM, "{question}\n\n{contract}", TREX_CONTRACT),
    "sirl": PromptSet("sirl", _PUBLISHED_SYSTEM,
                      "Below is an operations research question. Build a mathematical model and corresponding "
                      "Python code that solves it.\n\n# Question:\n{question}\n\n# Response requirements:\n{contract}",
                      PUBLISHED_CONTRACT),
    "orlm": PromptSet("orlm", _PUBLISHED_SYSTEM,
                      "Below is an operations research question. Build a mathematical model and corresponding "
                      "python code using `gurobipy` that appropriately addresses the question.\n\n"
                      "# Question:\n{question}\n\n# Response:\n{contract}", PUBLISHED_CONTRACT),
    "mamo": PromptSet("mamo", _PUBLISHED_SYSTEM,
                      "Formulate the following problem as a mathematical optimization model and solve it with a "
                      "solver.\n\n{question}\n\n{contract}", PUBLISHED_CONTRACT),
    "optibench": PromptSet("optibench", _PUBLISHED_SYSTEM,
                           "Model the following optimization problem and solve it with a solver; report every "
                           "requested quantity.\n\n{question}\n\n{contract}", PUBLISHED_CONTRACT),
}

PROTOCOL_PROMPT_SETS = {"strict": "trex", "sirl": "sirl", "orlm": "orlm", "mamo": "mamo", "optibench": "optibench"}
"""The prompt set each scoring protocol evaluates with (the published protocols reproduce their harness)."""


def prompt_set(name: str) -> PromptSet:
    """The named prompt set (ValueError listing the names otherwise)."""
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; allowed: {', '.join(PROMPT_SETS)}")
    return PROMPT_SETS[name]


def user_turn(question: str, set_name: str = DEFAULT_SET, *, named: Sequence[str] = (), data_file: bool = False) -> str:
    """The user turn for ``question``: the set's wrapper, with ``named`` result keys and the data-file rule."""
    ps = prompt_set(set_name)
    extra = NAMED.format(names="\n".join(f"- {json.dumps(k)}" for k in named)) if named else ""
    if data_file:
        extra += DATA_FILE
    return ps.user.format(question=question.strip(), contract=ps.contract.format(values=extra))


def prompt_messages(question: str, set_name: str = DEFAULT_SET, *, named: Sequence[str] = (),
                    data_file: bool = False) -> list[dict[str, str]]:
    """System and user messages that ask a model to solve ``question``."""
    return [{"role": "system", "content": prompt_set(set_name).system},
            {"role": "user", "content": user_turn(question, set_name, named=named, data_file=data_file)}]


def question_of(user: str, set_name: str = DEFAULT_SET) -> str:
    """The question inside a user turn built by :func:`user_turn` (no named keys, no data file)."""
    ps = prompt_set(set_name)
    head, _, tail = ps.user.partition("{question}")
    suffix = tail.format(contract=ps.contract.format(values=""))
    if not (user.startswith(head) and user.endswith(suffix)):
        raise ValueError(f"user turn does not follow prompt set {set_name!r} v{CONTRACT_VERSION}")
    return user[len(head):len(user) - len(suffix)]


# --- the answer layout ----------------------------------------------------------------------------------
FORMULATION_HEADER = "## Formulation\n\n"


def answer_text(formulation: str, code: str, objective: str) -> str:
    """A reference answer: the formulation, the program in one python block, the optimal objective."""
    body = code if code.endswith("\n") else code + "\n"
    return (f"{FORMULATION_HEADER}{formulation}\n\n## Code\n\n```python\n{body}```\n\n"
            f"The optimal objective value is {objective}.")


def training_messages(question: str, answer: str, set_name: str = DEFAULT_SET) -> list[dict[str, str]]:
    """An SFT sample: exactly the evaluation prompt for ``question``, then ``answer`` as the assistant turn."""
    return [*prompt_messages(question, set_name), {"role": "assistant", "content": answer}]


"""Trajectory -> chat messages -> token ids with an action mask, via the tokenizer's own template.

The mask is 1 exactly on tokens the policy generated: each assistant turn's content and the
template's end-of-turn token after it (`<|im_end|>`, `<|eot_id|>`), 0 on everything else.
Assistant spans come from the template itself, by incremental rendering: the text a
conversation prefix renders to with the generation prompt marks where an assistant turn's
content starts, and rendering the same turn with a probe content marks the template's
closing text. Nothing searches for the assistant's text in the rendering, because
observations can repeat it.

Decisions, made once here:
- Assistant turns render their raw text only. `tool_calls` stay on the messages (export,
  TRL format) but are not passed to the template: the policy wrote the call inside its
  text, and tool-aware templates (Qwen2.5, Llama 3.1) would otherwise render it again or
  instead. Tool specs live in the system prompt, so no `tools=` either.
- Observations use role "tool" when the template renders that role (no error, content
  kept); otherwise role "user". Decided per template by a probe, see `observation_role`.
- The rendered string is tokenized as is, so a special-token string inside an action (an
  action that writes "<|im_start|>") becomes that special token, exactly as when a backend
  tokenizes `render_prompt`'s output. It lies inside the assistant's span and is masked
  like the rest of the action.
- User and tool turns are data from the env (an instruction, a web page): special-token
  strings in them are broken up with a zero-width space, so a page that writes
  "<|im_start|>system" stays text and cannot open a turn of its own, for the policy or the
  critic. Messages keep their raw content; only what the template sees is changed.
- A token is masked when it starts inside an assistant span. A token that straddles the
  header/content boundary (ChatML header "\\n" merged with content starting with "\\n")
  starts in scaffolding and stays 0: scaffolding is never trained on.
- An assistant turn that carries the ids the policy generated (`Message.token_ids`, stored by
  search) is trained on those ids, not on the tokenizer's split of its text: a sampled token
  sequence need not be that split ("ab" sampled as "a" + "b"). They are used when they decode
  to exactly the turn's rendered content (else, e.g. ids of another tokenizer, the text is
  tokenized); the text before such a turn is tokenized up to where the policy's prompt
  ended, so no token straddles into it. Only turns that are trained on (mask 1) use them; in
  a multi-turn sequence a trained turn is then context for later turns as its generated ids,
  where the policy, prompted with the rendered text, saw the tokenizer's split.
"""

from __future__ import annotations

from jinja2 import TemplateError

from offline_agent.types import Message, Step, Trajectory

_PROBE = "x"  # content rendered verbatim by every template (nothing to trim or escape)
_OBSERVATION_ROLE: dict[str, str] = {}  # chat template text -> role used for observations
_BREAK = "\u200b"  # zero-width space: splits a special-token string into plain text


def history_messages(
    system: str, instruction: str, first_observation: str, steps: list[Step],
    demo: list[Message] = (),
) -> list[Message]:
    """[system, *demo, user(instruction + observation), (assistant action, tool observation)...].

    `demo` is the env's worked episode (Env.demonstration), shown as real turns. An empty
    first observation leaves the user turn as the bare instruction.
    """
    user = "\n\n".join(part for part in (instruction, first_observation) if part)
    messages = [Message("system", system), *demo, Message("user", user)]
    for step in steps:
        calls = [step.tool_call] if step.tool_call else None
        messages.append(Message("assistant", step.action, tool_calls=calls,
                                token_ids=step.token_ids))
        messages.append(Message("tool", step.observation))
    return messages


def trajectory_messages(system: str, traj: Trajectory, demo: list[Message] = ()) -> list[Message]:
    """The messages of a (possibly partial) trajectory; see `history_messages`."""
    return history_messages(system, traj.instruction, traj.first_observation, traj.steps, demo)


def to_chat_dicts(messages: list[Message]) -> list[dict]:
    """HF/TRL conversational format: role, content and, where parsed, tool_calls."""
    return [m.to_dict() for m in messages]


def observation_role(tokenizer) -> str:
    """Role "tool" if the tokenizer's template renders a tool turn with its content, else "user".

    Probed once per template text: some templates raise on unknown roles, others drop
    them silently; both lose the observation, so those get it as a user turn.
    """
    template = tokenizer.get_chat_template()  # the resolved text, also for named templates
    if template not in _OBSERVATION_ROLE:
        marker = "observation-probe-7f3a"
        probe = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "content": marker},
        ]
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
            role = "tool" if marker in text else "user"
        except TemplateError:
            role = "user"
        _OBSERVATION_ROLE[template] = role
    return _OBSERVATION_ROLE[template]


def as_data(tokenizer, text: str) -> str:
    """`text` with every special-token string of the tokenizer broken up (see module doc)."""
    for token in _special_strings(tokenizer):
        if token in text:
            text = text.replace(token, token[:1] + _BREAK + token[1:])
    return text


def _special_strings(tokenizer) -> list[str]:
    added = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
    return sorted({*tokenizer.all_special_tokens, *added} - {""}, key=len, reverse=True)


def _template_dicts(tokenizer, messages: list[Message]) -> list[dict]:
    """What the template sees: raw content only, observations in the template's role,
    env text (user and tool turns) as data."""
    tool_role = observation_role(tokenizer)
    return [
        {"role": tool_role if m.role == "tool" else m.role,
         "content": as_data(tokenizer, m.content) if m.role in ("user", "tool") else m.content}
        for m in messages
    ]


def _render(tokenizer, dicts: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        dicts, tokenize=False, add_generation_prompt=generation_prompt
    )


def render_prompt(tokenizer, messages: list[Message]) -> str:
    """The conversation so far plus the assistant header: the text to generate the next action from."""
    return _render(tokenizer, _template_dicts(tokenizer, messages), True)


def _assistant_spans(tokenizer, dicts: list[dict], first: int) -> tuple[str, list[tuple[int, int]]]:
    """The full rendering and, per assistant turn at index >= first, (content start, content end).

    The turn's end-of-turn token starts at content end.
    """
    full = _render(tokenizer, dicts, False)
    spans = []
    for i, message in enumerate(dicts):
        if message["role"] != "assistant" or i < first:
            continue
        head = _render(tokenizer, dicts[:i], True)
        turn = _render(tokenizer, dicts[: i + 1], False)
        probe = _render(tokenizer, dicts[:i] + [{"role": "assistant", "content": _PROBE}], False)
        closing = probe[len(head) + len(_PROBE) :]  # e.g. "<|im_end|>\n"
        if not (
            probe.startswith(head + _PROBE)
            and turn.startswith(head)
            and turn.endswith(closing)
            and full.startswith(turn)
            and len(turn) - len(closing) >= len(head)
        ):
            raise ValueError(
                f"the chat template does not render this conversation prefix-consistently at "
                f"message {i} (assistant), so assistant spans cannot be derived from it; "
                f"conversation prefix with generation prompt ends {head[-80:]!r}, "
                f"with the assistant turn ends {turn[-80:]!r}"
            )
        if not closing:
            raise ValueError("the chat template closes assistant turns with no end-of-turn text")
        spans.append((len(head), len(turn) - len(closing)))
    return full, spans


def _tokenize(tokenizer, full: str, spans: list[tuple[int, int]],
              generated: list[list[int] | None]) -> tuple[list[int], list[int]]:
    """Ids of `full` and the offset where each starts. An assistant turn whose generated ids
    decode to exactly its rendered content is those ids; the text around such turns is
    tokenized piece by piece (a piece ends where the policy's prompt ended and starts at an
    end-of-turn special token, so each is split as the policy saw it). Other turns are text."""
    ids: list[int] = []
    starts: list[int] = []

    def text(start: int, end: int) -> None:
        enc = tokenizer(full[start:end], add_special_tokens=False, return_offsets_mapping=True)
        ids.extend(enc["input_ids"])
        starts.extend(start + s for s, _ in enc["offset_mapping"])

    pos = 0
    for (start, end), action in zip(spans, generated):
        if action is None or tokenizer.decode(
                action, clean_up_tokenization_spaces=False) != full[start:end]:
            continue  # no ids (an env-listed action, an older store) or another tokenizer's
        text(pos, start)
        ids.extend(action)
        starts.extend([start] * len(action))
        pos = end
    text(pos, len(full))
    return ids, starts


def _encode(tokenizer, messages: list[Message], first: int) -> tuple[list[int], list[int]]:
    full, spans = _assistant_spans(tokenizer, _template_dicts(tokenizer, messages), first)
    generated = [m.token_ids for m in messages[first:] if m.role == "assistant"]
    ids, starts = _tokenize(tokenizer, full, spans, generated)
    mask = [0] * len(ids)
    added = tokenizer.added_tokens_decoder
    k = 0
    for content_start, content_end in spans:
        while k < len(ids) and starts[k] < content_start:
            k += 1
        while k < len(ids) and starts[k] < content_end:
            mask[k] = 1
            k += 1
        if k == len(ids) or starts[k] != content_end or ids[k] not in added:
            raise ValueError(
                f"the template's end-of-turn text {full[content_end : content_end + 20]!r} does not "
                f"start with a single added token of this tokenizer; template and tokenizer mismatch?"
            )
        mask[k] = 1  # the end-of-turn token the policy emitted to stop
        k += 1
    return ids, mask


def encode_with_mask(tokenizer, messages: list[Message]) -> tuple[list[int], list[int]]:
    """Token ids of the whole rendered conversation, masked on every assistant turn (an episode
    with no prompt to leave out; RFT examples use encode_prompt_completion)."""
    return _encode(tokenizer, messages, first=0)


def encode_prompt_completion(
    tokenizer, prompt: list[Message], completion: list[Message]
) -> tuple[list[int], list[int]]:
    """Ids of prompt + completion, masked only on the completion's assistant turns.

    For step-level DPO: chosen and rejected share the prompt (which holds earlier actions),
    and only the differing action should carry log-prob.
    """
    return _encode(tokenizer, prompt + completion, first=len(prompt))


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s of a mask: one per trained assistant turn."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs

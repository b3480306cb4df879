"""The reward hub (seed step 26): rule-based rewards, a remote reward model over HTTP, custom functions, and the simulator's reward.

Which reward runs is chosen once, from the arguments: ``--custom-rm-path`` (a dotted path) wins,
then ``--rm-type``: ``exact`` / ``math`` (decoded text against the label, no network),
``token`` (token ids against the label, for tiny random models), ``remote`` (POST to a reward
server), ``sim`` (a seeded Bernoulli reward with no model at all). Without either, a dataset with
labels gets ``math``. Rewards are computed per sample as it finishes, or once per group with
``--group-rm`` (seed step 26).
"""

from __future__ import annotations

import hashlib
import inspect
import re
import struct
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from vime.errors import ConfigError, VimeError

if TYPE_CHECKING:
    from vime.config import DataConfig

RM_TYPES = ("exact", "math", "token", "remote", "sim")


class RewardError(VimeError):
    """A reward could not be computed (remote reward model unreachable, custom function failed)."""


# --------------------------------------------------------------------------------------------
# Rule-based rewards (no network)
# --------------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\$?([^\n$]+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def extract_answer(text: str) -> str | None:
    """The final answer in a response: the last ``\\boxed{...}``, else "answer is X", else the last number."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    answers = _ANSWER_IS.findall(text)
    if answers:
        return str(answers[-1]).strip().rstrip(".")
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _last_boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = starts[-1]
    depth = 1
    j = i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1] if depth == 0 else None


def normalize_answer(answer: str) -> str:
    """Canonical text of an answer: no spaces, dollars, \\left/\\right, \\text{}, trailing dot; numbers reduced."""
    s = answer.strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right|!|,|;|quad)", "", s)
    s = re.sub(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
    s = s.replace("$", "").replace(" ", "").rstrip(".").lower()
    num = _as_number(s)
    return s if num is None else str(num)


def _as_number(s: str) -> Fraction | None:
    s = s.replace(",", "").replace("(", "").replace(")", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def math_reward(response: str, label: Any) -> float:
    """1.0 when the response's final answer equals the label after normalisation, else 0.0."""
    if label is None:
        raise ConfigError("--rm-type math needs a label per prompt (--label-key names the dataset field)")
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    return 1.0 if normalize_answer(answer) == normalize_answer(str(label)) else 0.0


def exact_reward(response: str, label: Any) -> float:
    """1.0 when the stripped response text equals the stripped label."""
    if label is None:
        raise ConfigError("--rm-type exact needs a label per prompt (--label-key names the dataset field)")
    return 1.0 if response.strip() == str(label).strip() else 0.0


def token_reward(response_tokens: Sequence[int], label: Any) -> float:
    """1.0 when any of the label's token ids occurs in the response (usable with a tiny random model)."""
    if label is None:
        raise ConfigError("--rm-type token needs a label per prompt: a token id or a list of token ids")
    targets = {int(t) for t in (label if isinstance(label, (list, tuple)) else [label])}
    return 1.0 if any(t in targets for t in response_tokens) else 0.0


def _unit(*key: object) -> float:
    """A uniform number in [0, 1) from a stable hash of `key` (independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return struct.unpack("<Q", digest)[0] / 2.0**64


def sim_reward(seed: int, group_index: int, index: int) -> float:
    """The simulator's reward: Bernoulli(p_group) with p_group uniform per prompt, all seeded.

    With groups of 8 about 2/9 of the groups come out uniform (all 0 or all 1), enough for
    ``check_reward_nonzero_std`` to have something to drop.
    """
    p = _unit(seed, "group", group_index)
    return 1.0 if _unit(seed, "sample", index) < p else 0.0


# --------------------------------------------------------------------------------------------
# The hub
# --------------------------------------------------------------------------------------------


class RewardHub:
    """Computes rewards for samples; built once per run from the reward options (``--rm-type``, ``--rm-url``,
    ``--group-rm``) and the run's seed (the simulator's reward).

    `transport` is passed to the httpx client of the remote reward model (tests give an
    ``httpx.MockTransport``); `tokenizer` decodes responses when a sample has no text yet.
    """

    def __init__(self, cfg: DataConfig, *, seed: int, rm_type: str | None = None,
                 custom: Callable[[Any], Any] | None = None, url: str | None = None, tokenizer: Any = None,
                 transport: Any = None, timeout_s: float = 60.0, max_attempts: int = 3) -> None:
        self.tokenizer = tokenizer
        self.group_rm = cfg.group_rm
        self.seed = seed
        # --custom-rm-path, loaded and bound by vime.rollout.plugins: fn(sample), or fn(samples) with --group-rm
        self.custom = custom
        self.rm_type = rm_type or cfg.rm_type or ("custom" if self.custom else "math")
        if self.custom is None and self.rm_type not in RM_TYPES:
            raise ConfigError(f"--rm-type {self.rm_type!r} is unknown; use one of {', '.join(RM_TYPES)} or "
                              f"--custom-rm-path module.function")
        self.url = url or cfg.rm_url
        if self.custom is None and self.rm_type == "remote" and not self.url:
            raise ConfigError("--rm-type remote needs the reward server's URL (--rm-url http://host:port/path)")
        self._transport = transport
        self._timeout_s = timeout_s
        self._max_attempts = max_attempts
        self._client: Any = None

    @property
    def name(self) -> str:
        return "custom" if self.custom else self.rm_type

    async def score(self, sample: Any) -> float | dict[str, float]:
        """The reward of one finished sample."""
        if self.custom is not None:
            return await _maybe_await(self.custom(sample))
        kind = self.rm_type
        if kind == "sim":
            return sim_reward(self.seed, sample.group_index, sample.index)
        if kind == "token":
            return token_reward(_response_tokens(sample), sample.label)
        if kind == "remote":
            return await self._remote(sample)
        text = self._response_text(sample)
        return exact_reward(text, sample.label) if kind == "exact" else math_reward(text, sample.label)

    async def score_group(self, samples: Sequence[Any]) -> list[Any]:
        """Rewards of one finished group (``--group-rm``); a custom function gets the whole group at once."""
        if self.custom is not None:
            rewards = await _maybe_await(self.custom(list(samples)))
            if not isinstance(rewards, (list, tuple)) or len(rewards) != len(samples):
                raise RewardError(f"--custom-rm-path with --group-rm must return one reward per sample "
                                  f"({len(samples)}), got {rewards!r:.80}")
            return list(rewards)
        import asyncio

        return list(await asyncio.gather(*(self.score(s) for s in samples)))

    def _response_text(self, sample: Any) -> str:
        text = getattr(sample, "response", None)
        if text:
            return str(text)
        if self.tokenizer is None:
            raise ConfigError(f"--rm-type {self.rm_type} compares decoded text but there is no tokenizer to "
                              f"decode the response; pass --hf-checkpoint or use --rm-type token")
        return str(self.tokenizer.decode(_response_tokens(sample)))

    async def _remote(self, sample: Any) -> float:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, timeout=self._timeout_s)
        payload = {"prompt": getattr(sample, "prompt", None), "response": self._response_text(sample),
                   "label": sample.label, "metadata": getattr(sample, "metadata", None) or {}}
        last = ""
        for _ in range(self._max_attempts):
            try:
                resp = await self._client.post(self.url, json=payload)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code != 200:
                raise RewardError(f"reward model {self.url} answered HTTP {resp.status_code}: {resp.text[:200]}")
            body = resp.json()
            value = body.get("reward", body.get("score")) if isinstance(body, dict) else body
            try:
                return float(value)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise RewardError(f"reward model {self.url} returned {body!r:.200}; expected a number or "
                                  f'{{"reward": number}}') from None
        raise RewardError(f"reward model {self.url} failed {self._max_attempts} times; last: {last}")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _response_tokens(sample: Any) -> list[int]:
    n = sample.response_length
    return list(sample.tokens[len(sample.tokens) - n:]) if n else []


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value

"""A RolloutEngine that hands every call to the engine it wraps: the base of wrappers that change one part (weights)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vime.protocols import GenerateRequest, GenerateResult, PauseMode


class DelegatingEngine:
    """Forwards the `vime.protocols.RolloutEngine` surface to ``self.inner``; subclasses override what they change.

    Attributes the wrapper lacks (``stats``, ``gpus`` …) are the inner engine's too.
    """

    inner: Any

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy/pickle): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self.inner.generate(request)  # type: ignore[no-any-return]

    async def sleep(self, level: int, mode: PauseMode = "keep") -> None:
        await self.inner.sleep(level, mode)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await self.inner.wake_up(tags)

    async def is_sleeping(self) -> bool:
        return bool(await self.inner.is_sleeping())

    async def pause(self, mode: PauseMode = "abort") -> None:
        await self.inner.pause(mode)

    async def resume(self) -> None:
        await self.inner.resume()

    async def is_paused(self) -> bool:
        return bool(await self.inner.is_paused())

    async def flush_cache(self) -> None:
        await self.inner.flush_cache()

    async def weight_version(self) -> str | None:
        return await self.inner.weight_version()  # type: ignore[no-any-return]

    async def health(self) -> bool:
        return bool(await self.inner.health())

    async def restart(self) -> None:
        await self.inner.restart()

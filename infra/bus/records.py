"""What a consumer hands a handler, the errors a handler raises to steer the loop, and a bounded key set."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from schemas.topics import REDRIVE_GROUP_HEADER

E = TypeVar("E", bound=msgspec.Struct)


class FatalError(Exception):
    """Raised by a handler to stop the consumer (and the process) instead of dead-lettering a record."""


class TransientError(Exception):
    """Raised by a handler for a fault of the moment (a store, a sandbox, a peer that did not answer):
    the record is retried, never dead-lettered."""


TRANSIENT: tuple[type[BaseException], ...] = (TransientError, OSError, MemoryError)


def is_transient(fault: BaseException) -> bool:
    """A fault of the moment: `TRANSIENT`, or an accelerator's or allocator's out-of-memory
    (`torch.OutOfMemoryError` is a RuntimeError; matched by class name so the bus need not import torch)."""
    return isinstance(fault, TRANSIENT) or any(c.__name__ == "OutOfMemoryError" for c in type(fault).__mro__)


def redriven_elsewhere(
    headers: Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None, group: str | None
) -> bool:
    """Whether a record (its headers) is a DLQ redrive meant for another consumer group than `group`
    (None: a group-less reader, for which every group's redrive is a copy of what it saw)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    target = next((bytes(v).decode(errors="replace") for n, v in pairs if n == REDRIVE_GROUP_HEADER), None)
    return target is not None and target != group


@dataclass(frozen=True, slots=True)
class Record(Generic[E]):
    topic: str  # LOGICAL name, e.g. schemas.topics.TRAJECTORIES
    partition: int
    offset: int
    key: str | None
    value: E  # decoded Struct of TOPICS[topic].value_type
    timestamp_ms: int
    headers: dict[str, bytes] = field(default_factory=dict)


class RecentKeys:
    """Bounded LRU set of keys (idempotency keys, finished ids): memory stays flat on a long run."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: str) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        return False

    def add(self, key: str) -> None:
        if self.size == 0:
            return
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.size:
            self._keys.popitem(last=False)

"""Append-only JSONL logs, flushed per record so a kill loses at most the line being written."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class JsonlLog:
    """Append records (with a timestamp) to a JSONL file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Write one record with a ``time`` field."""
        rec = {"time": time.time(), **record}
        self._fh.write(json.dumps(rec, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the file."""
        self._fh.close()

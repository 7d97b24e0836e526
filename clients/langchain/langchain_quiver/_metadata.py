"""A LangChain document as one quiver row's metadata, and back, without loss.

A row's metadata holds:

- the document's own metadata values that quiver stores as they are: strings,
  booleans, integers that fit 64 signed bits, finite floats, and lists of
  strings. These come back as sent and can be filtered on;
- ``_lc_text``: the page content;
- ``_lc_id``: the LangChain string id (see `quiver_vectors.string_ids`);
- ``_lc_json``: every other value (None, dicts, lists holding anything but
  strings, larger integers, NaN and infinities), as one JSON object, so the
  document comes back equal to what went in. These values cannot be filtered
  on.

quiver limits a row's metadata to 64 entries and 16 KiB of JSON by default
(`--metadata-entries-max`, `--metadata-bytes-max`), page content included: a
larger document is refused with the server's own detail.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Mapping, Optional, Tuple

TEXT_KEY = "_lc_text"
ID_KEY = "_lc_id"
JSON_KEY = "_lc_json"
RESERVED_KEYS = (TEXT_KEY, ID_KEY, JSON_KEY)

_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1


def is_native(value: Any) -> bool:
    """True for a value quiver stores and returns unchanged (and can filter on)."""
    if isinstance(value, (str, bool)):
        return True
    if isinstance(value, int):
        return _INT_MIN <= value <= _INT_MAX
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(isinstance(item, str) for item in value)
    return False


def encode(text: str, doc_id: str, metadata: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The row metadata for one document."""
    row: Dict[str, Any] = {}
    other: Dict[str, Any] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"metadata keys must be strings, got {key!r}")
        if key in RESERVED_KEYS:
            raise ValueError(f"metadata key {key!r} is reserved by langchain-quiver")
        if is_native(value):
            row[key] = value
        else:
            other[key] = value
    row[TEXT_KEY] = text
    row[ID_KEY] = doc_id
    if other:
        try:
            # allow_nan: Python's json reads its NaN and Infinity back.
            row[JSON_KEY] = json.dumps(other, ensure_ascii=False, allow_nan=True)
        except TypeError as exc:
            raise TypeError(f"metadata of document {doc_id!r}: {exc}") from None
    return row


def decode(row: Mapping[str, Any]) -> Tuple[str, Optional[str], Dict[str, Any]]:
    """(page content, string id, metadata) of a row written by `encode`."""
    metadata = {k: v for k, v in row.items() if k not in RESERVED_KEYS}
    extra = row.get(JSON_KEY)
    if isinstance(extra, str):
        metadata.update(json.loads(extra))
    text = row.get(TEXT_KEY)
    doc_id = row.get(ID_KEY)
    return (text if isinstance(text, str) else ""), (doc_id if isinstance(doc_id, str) else None), metadata

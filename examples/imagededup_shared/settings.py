"""Settings from the environment, read once per process (both services read the same)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DATABASE_URL = "sqlite:///imagededup.sqlite"


def database_url() -> str:
    return os.environ.get("IMAGEDEDUP_DATABASE_URL", DEFAULT_DATABASE_URL)


def media_root() -> Path:
    """Where uploads and thumbnails live; both services must see the same directory."""
    return Path(os.environ.get("IMAGEDEDUP_MEDIA", "imagededup-media")).resolve()


def max_upload_bytes() -> int:
    return int(os.environ.get("IMAGEDEDUP_MAX_UPLOAD_BYTES", str(10 * 1024 * 1024)))


def hash_concurrency() -> int:
    return int(os.environ.get("IMAGEDEDUP_HASH_CONCURRENCY", "2"))


def originals_dir() -> Path:
    return media_root() / "originals"


def thumbnail_path(image_id: int) -> Path:
    return media_root() / "thumbnails" / f"{image_id}.png"

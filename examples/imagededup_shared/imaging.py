"""Pillow and imagehash: checking uploads, building the per-image artifact."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import imagehash
from PIL import Image as PILImage
from PIL import ImageOps, UnidentifiedImageError

# Formats a browser or camera produces; anything else Pillow happens to read is refused.
ACCEPTED_FORMATS = frozenset({"JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF"})
# Far below Pillow's own bomb limit (~179 Mpx): a thumbnailer has no use for more.
MAX_PIXELS = 50_000_000
THUMBNAIL_SIZE = (128, 128)


class RejectedImage(ValueError):
    """An upload that is not an acceptable image; the message is for the client."""


class CorruptImage(ValueError):
    """A file that looked like an image but cannot be decoded."""


@dataclass(frozen=True)
class Sniffed:
    format: str
    width: int
    height: int


@dataclass(frozen=True)
class Artifact:
    phash: str
    dhash: str
    width: int
    height: int
    thumbnail: str


def sniff(data: bytes, filename: str) -> Sniffed:
    """Check the header only (cheap, in the API): format and dimensions.

    A file whose header is fine but whose body is damaged passes, and fails later in
    the hash worker with a readable error; decoding every upload in the API would
    make the request as slow as the work it hands off.
    """
    try:
        with PILImage.open(io.BytesIO(data)) as image:
            fmt, (width, height) = image.format or "", image.size
    except UnidentifiedImageError:
        raise RejectedImage(f"{filename}: not an image Pillow can identify") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise RejectedImage(f"{filename}: unreadable image header ({exc})") from None
    if fmt not in ACCEPTED_FORMATS:
        raise RejectedImage(
            f"{filename}: {fmt or 'unknown'} images are not accepted"
            f" (accepted: {', '.join(sorted(ACCEPTED_FORMATS))})"
        )
    if width * height > MAX_PIXELS:
        raise RejectedImage(f"{filename}: {width}x{height} exceeds {MAX_PIXELS} pixels")
    return Sniffed(fmt, width, height)


def build_artifact(path: Path, thumbnail: Path) -> Artifact:
    """Decode the whole image, hash it and write its thumbnail (atomically, by rename).

    The thumbnail is written outside the database transaction: if the handler's
    transaction is then lost, a later run simply writes the same file again.
    """
    try:
        with PILImage.open(path) as opened:
            opened.load()  # decodes everything: a truncated body raises here
            image = ImageOps.exif_transpose(opened).convert("RGB")
    except FileNotFoundError:
        raise CorruptImage(f"{path.name}: file is missing ({path})") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise CorruptImage(f"{path.name}: cannot decode image: {exc}") from None
    phash = str(imagehash.phash(image))
    dhash = str(imagehash.dhash(image))
    small = image.copy()
    small.thumbnail(THUMBNAIL_SIZE)
    thumbnail.parent.mkdir(parents=True, exist_ok=True)
    partial = thumbnail.with_name(f".{thumbnail.name}.{os.getpid()}.tmp")
    small.save(partial, format="PNG")
    os.replace(partial, thumbnail)
    return Artifact(phash, dhash, image.width, image.height, str(thumbnail))


def distance(a: str, b: str) -> int:
    """Hamming distance of two hex-encoded 64-bit hashes."""
    return (int(a, 16) ^ int(b, 16)).bit_count()

"""Deterministic sample images with planted near-duplicates, for tests and the benchmark.

Each *scene* is drawn from a seed (a gradient sky, a ground, shapes, noise), so the same
arguments always give the same files, and nothing is downloaded. A duplicate group is a
scene plus variants of it that a person would call the same photograph: resized,
re-encoded as a low-quality JPEG, cropped at the edges, brightened.

Real photographs can be added too: the few that scikit-image ships inside its wheel (the
``examples`` extra installs it), read straight from its data folder with Pillow, so nothing
is fetched at run time either. Each one gets all four variants as its planted group.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

SIZE = (320, 240)


def scene(seed: int, size: tuple[int, int] = SIZE) -> Image.Image:
    rng = random.Random(seed)
    width, height = size
    image = Image.new("RGB", size)
    draw = ImageDraw.Draw(image)
    top = [rng.randrange(256) for _ in range(3)]
    bottom = [rng.randrange(256) for _ in range(3)]
    for y in range(height):
        t = y / (height - 1)
        draw.line(
            [(0, y), (width, y)],
            fill=tuple(int(a + (b - a) * t) for a, b in zip(top, bottom, strict=True)),
        )
    for _ in range(rng.randrange(5, 10)):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        w, h = rng.randrange(width // 8, width // 2), rng.randrange(height // 8, height // 2)
        colour = tuple(rng.randrange(256) for _ in range(3))
        box = [x0 - w // 2, y0 - h // 2, x0 + w // 2, y0 + h // 2]
        if rng.random() < 0.5:
            draw.ellipse(box, fill=colour)
        else:
            draw.rectangle(box, fill=colour)
    return image.filter(ImageFilter.GaussianBlur(1.5))


def _encode(image: Image.Image, fmt: str = "PNG", **options: int) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def resized(image: Image.Image) -> bytes:
    return _encode(image.resize((image.width // 2, image.height // 2), Image.Resampling.LANCZOS))


def reencoded(image: Image.Image) -> bytes:
    return _encode(image, "JPEG", quality=35)


def cropped(image: Image.Image) -> bytes:
    dx, dy = image.width // 50, image.height // 50
    return _encode(image.crop((dx, dy, image.width - dx, image.height - dy)))


def brightened(image: Image.Image) -> bytes:
    return _encode(ImageEnhance.Brightness(image).enhance(1.15))


VARIANTS: dict[str, Callable[[Image.Image], bytes]] = {
    "resized": resized,
    "reencoded": reencoded,
    "cropped": cropped,
    "brightened": brightened,
}


@dataclass
class SampleSet:
    """Files written and the planted truth: groups of file names that are duplicates."""

    files: list[Path] = field(default_factory=list)
    groups: list[frozenset[str]] = field(default_factory=list)


# Photographs bundled in scikit-image's wheel (skimage/data/), not the ones it downloads.
PHOTOGRAPHS = (
    "astronaut.png",
    "coffee.png",
    "chelsea.png",
    "rocket.jpg",
    "camera.png",
    "motorcycle_left.png",
)


def photograph(name: str, longest: int = 384) -> Image.Image:
    """One of :data:`PHOTOGRAPHS`, read from the installed scikit-image; never downloaded.

    Scaled down to ``longest`` pixels on its long side, near the scenes' size.
    """
    try:
        from skimage import data
    except ImportError as exc:  # pragma: no cover - the examples extra installs it
        raise RuntimeError(
            "real photographs need scikit-image: pip install 'dbworker[examples]'"
        ) from exc
    path = Path(data.data_dir) / name
    if not path.is_file():
        raise RuntimeError(f"{name} is not bundled in this scikit-image ({data.data_dir})")
    with Image.open(path) as image:
        photo = image.convert("RGB")
    photo.thumbnail((longest, longest), Image.Resampling.LANCZOS)
    return photo


def _planted(directory: Path, stem: str, base: Image.Image, variants: list[str]) -> list[Path]:
    """The original and its variants, written; the original first."""
    original = directory / f"{stem}.png"
    original.write_bytes(_encode(base))
    paths = [original]
    for variant in variants:
        path = directory / f"{stem}-{variant}.{'jpg' if variant == 'reencoded' else 'png'}"
        path.write_bytes(VARIANTS[variant](base))
        paths.append(path)
    return paths


def generate(
    directory: Path, *, groups: int, singles: int, seed: int = 0, photographs: int = 0
) -> SampleSet:
    """Write ``groups`` scenes with 1-4 variants each and ``singles`` unrelated scenes.

    ``photographs`` real photographs (the first of :data:`PHOTOGRAPHS`), each with all four
    variants, are written after the scene groups and before the singles; their groups
    follow the scenes' in ``groups``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    result = SampleSet()
    names = list(VARIANTS)
    for n in range(groups):
        chosen = rng.sample(names, rng.randrange(1, len(names) + 1))
        paths = _planted(directory, f"scene{n:05d}", scene(seed * 1_000_003 + n), chosen)
        result.files.extend(paths)
        result.groups.append(frozenset(path.name for path in paths))
    for name in PHOTOGRAPHS[:photographs]:
        paths = _planted(directory, f"photo-{Path(name).stem}", photograph(name), names)
        result.files.extend(paths)
        result.groups.append(frozenset(path.name for path in paths))
    for n in range(groups, groups + singles):
        result.files.extend(_planted(directory, f"scene{n:05d}", scene(seed * 1_000_003 + n), []))
    return result


def truncated(data: bytes) -> bytes:
    """The first half of an encoded image: its header is fine, its body is not."""
    return data[: len(data) // 2]

"""The work itself, written once and run by either system: hash one image, compare
one page of a collection. Neither function commits: the caller's transaction does.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from . import imaging, settings
from .models import Collection, DuplicateGroup, DuplicatePair, GroupMember, Image


def hash_image(image: Image) -> None:
    """Build the image's artifact and store it in the row (raises CorruptImage)."""
    artifact = imaging.build_artifact(Path(image.path), settings.thumbnail_path(image.id))
    image.phash, image.dhash = artifact.phash, artifact.dhash
    image.width, image.height = artifact.width, artifact.height
    image.thumbnail = artifact.thumbnail
    image.hash_error = None
    image.hash_runs += 1


def compare_page(session: Session, collection: Collection) -> bool:
    """Compare the next page of images against all later ones; True when all are done.

    A page is up to ``page_size`` images after ``compared_through`` (the position in the
    collection's own row), each compared with every image of a larger id, so each pair
    is compared exactly once over the whole run. When no image is left, the duplicate
    pairs are joined into groups.
    """
    hashes = session.execute(
        select(Image.id, Image.phash).where(Image.collection_id == collection.id).order_by(Image.id)
    ).all()
    missing = [image_id for image_id, phash in hashes if phash is None]
    if missing:
        # Only reachable if the caller's gate is wrong: comparing now would miss pairs.
        raise RuntimeError(f"collection {collection.id}: images {missing} are not hashed")
    start = next(
        (n for n, (image_id, _) in enumerate(hashes) if image_id > collection.compared_through),
        len(hashes),
    )
    page = hashes[start : start + collection.page_size]
    if not page:
        collection.groups_found = _write_groups(session, collection)
        return True
    ints = [int(phash or "", 16) for _, phash in hashes]
    pairs = 0
    for offset, (left_id, _) in enumerate(page):
        position = start + offset
        left = ints[position]
        for other in range(position + 1, len(hashes)):
            bits = (left ^ ints[other]).bit_count()
            if bits <= collection.threshold:
                session.add(
                    DuplicatePair(
                        collection_id=collection.id,
                        image_a=left_id,
                        image_b=hashes[other][0],
                        distance=bits,
                    )
                )
        pairs += len(hashes) - position - 1
    collection.compared_through = page[-1][0]
    collection.pages_done += 1
    collection.pairs_compared += pairs
    return False


def _write_groups(session: Session, collection: Collection) -> int:
    """Connected components of the duplicate pairs (union-find), written as groups."""
    parent: dict[int, int] = {}

    def root(node: int) -> int:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for a, b in session.execute(
        select(DuplicatePair.image_a, DuplicatePair.image_b).where(
            DuplicatePair.collection_id == collection.id
        )
    ):
        parent[root(a)] = root(b)
    components: dict[int, list[int]] = {}
    for node in list(parent):
        components.setdefault(root(node), []).append(node)
    for members in components.values():
        group = DuplicateGroup(collection_id=collection.id, size=len(members))
        session.add(group)
        session.flush()  # the group's id, for its members
        session.add_all(GroupMember(group_id=group.id, image_id=m) for m in sorted(members))
    return len(components)

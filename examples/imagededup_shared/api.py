"""The HTTP API, the same for both examples; each passes in how its work system is told
about new images and asked for progress (a ``Jobs``).

Routes:
    POST /collections                       {"name", "threshold"?, "page_size"?}
    POST /collections/{id}/images           multipart, one or more "files"
    POST /collections/{id}/directory        {"path"}: register the images in a directory
    POST /collections/{id}/compare          seal: no more images; compare once all are hashed
    GET  /collections/{id}                  progress
    GET  /collections/{id}/groups           duplicate groups
    GET  /images/{id}                       one image: status, error, hashes
    POST /images/{id}/retry                 hash a FAILED image again (after repairing it)
    GET  /health
"""

# No "from __future__ import annotations": FastAPI resolves the routes' annotations at
# run time, and SessionDep is local to create_app.
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, File, HTTPException, UploadFile
from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from . import imaging, settings
from .models import Collection, DuplicateGroup, GroupMember, Image


class Jobs(Protocol):
    """What differs between dbworker and Celery, seen from the API."""

    def create_tables(self) -> None: ...

    def images_added(self, image_ids: Sequence[int]) -> None:
        """Called after the images' rows committed."""

    def compare_requested(self, collection_id: int) -> None:
        """Called after the collection was sealed (committed)."""

    def image_status(self, session: Session, image: Image) -> tuple[str | None, str | None]:
        """(status, error): status one of None, "working", "unfinished", "finished",
        "failed"."""

    def progress(self, session: Session, collection: Collection) -> dict[str, Any]:
        """hashed, failed (image counts) and compare (status) of a collection."""

    def retry(self, session: Session, image: Image) -> bool:
        """Make a failed image's hashing run again; False if it had not failed."""

    def after_retry(self, image: Image) -> None:
        """Called after retry() committed."""


class CollectionIn(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    threshold: int = Field(default=10, ge=0, le=32)
    page_size: int = Field(default=100, ge=1, le=10_000)


class DirectoryIn(BaseModel):
    path: str = Field(min_length=1)


IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff"})


def create_app(jobs: Jobs, session_factory: sessionmaker[Session]) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        jobs.create_tables()
        yield

    app = FastAPI(title="imagededup", lifespan=lifespan)

    def session() -> Any:
        with session_factory() as s:
            yield s

    SessionDep = Annotated[Session, Depends(session)]

    def open_collection(s: Session, collection_id: int) -> Collection:
        collection = s.get(Collection, collection_id)
        if collection is None:
            raise HTTPException(404, f"collection {collection_id} does not exist")
        if collection.sealed:
            raise HTTPException(409, f"collection {collection_id} is sealed: no more images")
        return collection

    def add_images(s: Session, collection: Collection, images: list[Image]) -> list[dict[str, Any]]:
        s.add_all(images)
        s.commit()
        jobs.images_added([image.id for image in images])
        return [{"id": i.id, "filename": i.filename} for i in images]

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/collections", status_code=201)
    def create_collection(body: CollectionIn, s: SessionDep) -> dict[str, Any]:
        collection = Collection(name=body.name, threshold=body.threshold, page_size=body.page_size)
        s.add(collection)
        s.commit()
        return {"id": collection.id, "name": collection.name}

    @app.post("/collections/{collection_id}/images", status_code=201)
    def upload(
        collection_id: int, files: Annotated[list[UploadFile], File()], s: SessionDep
    ) -> dict[str, Any]:
        collection = open_collection(s, collection_id)
        limit = settings.max_upload_bytes()
        # Everything is checked before anything is written: a request with one bad file
        # stores nothing, so a client can fix it and send the same request again.
        checked: list[tuple[str, bytes, imaging.Sniffed]] = []
        for upload in files:
            name = Path(upload.filename or "upload").name
            data = upload.file.read(limit + 1)
            if len(data) > limit:
                raise HTTPException(413, f"{name}: larger than {limit} bytes")
            if not data:
                raise HTTPException(422, f"{name}: empty file")
            try:
                checked.append((name, data, imaging.sniff(data, name)))
            except imaging.RejectedImage as exc:
                raise HTTPException(415, str(exc)) from None
        directory = settings.originals_dir()
        directory.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        images = []
        try:
            for name, data, sniffed in checked:
                path = directory / f"{uuid.uuid4().hex}{Path(name).suffix.lower()}"
                path.write_bytes(data)
                written.append(path)
                images.append(
                    Image(
                        collection_id=collection.id,
                        filename=name,
                        path=str(path),
                        size_bytes=len(data),
                        format=sniffed.format,
                    )
                )
            return {"images": add_images(s, collection, images)}
        except BaseException:
            # The rows did not commit (or never were added): their files go too.
            s.rollback()
            for path in written:
                path.unlink(missing_ok=True)
            raise

    @app.post("/collections/{collection_id}/directory", status_code=201)
    def register_directory(collection_id: int, body: DirectoryIn, s: SessionDep) -> dict[str, Any]:
        collection = open_collection(s, collection_id)
        directory = Path(body.path)
        if not directory.is_absolute():
            raise HTTPException(
                422, f"{body.path}: give an absolute path (the worker runs elsewhere)"
            )
        if not directory.is_dir():
            raise HTTPException(422, f"{body.path}: not a directory")
        images, skipped = [], []
        for path in sorted(directory.iterdir()):
            if not path.is_file() or path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            with path.open("rb") as f:
                head = f.read(64 * 1024)  # enough for any accepted format's header
            try:
                sniffed = imaging.sniff(head, path.name)
            except imaging.RejectedImage as exc:
                skipped.append({"filename": path.name, "reason": str(exc)})
                continue
            images.append(
                Image(
                    collection_id=collection.id,
                    filename=path.name,
                    path=str(path),
                    size_bytes=path.stat().st_size,
                    format=sniffed.format,
                )
            )
        if not images:
            raise HTTPException(422, f"{body.path}: no acceptable images", headers=None)
        return {"images": add_images(s, collection, images), "skipped": skipped}

    @app.post("/collections/{collection_id}/compare")
    def compare(collection_id: int, s: SessionDep) -> dict[str, Any]:
        collection = open_collection(s, collection_id)
        if not s.scalar(select(func.count()).where(Image.collection_id == collection.id)):
            raise HTTPException(409, f"collection {collection_id} has no images")
        collection.sealed = True
        s.commit()
        jobs.compare_requested(collection.id)
        return {"id": collection.id, "sealed": True}

    @app.get("/collections/{collection_id}")
    def progress(collection_id: int, s: SessionDep) -> dict[str, Any]:
        collection = s.get(Collection, collection_id)
        if collection is None:
            raise HTTPException(404, f"collection {collection_id} does not exist")
        # The jobs' state first, then the collection's row read again: under READ
        # COMMITTED each statement has its own snapshot, so a comparison reported
        # finished must not be shown beside the row as it was before that commit.
        jobs_progress = jobs.progress(s, collection)
        s.refresh(collection)
        images = s.scalar(select(func.count()).where(Image.collection_id == collection.id))
        return {
            "id": collection.id,
            "name": collection.name,
            "sealed": collection.sealed,
            "images": images,
            **jobs_progress,
            "pages_compared": collection.pages_done,
            "pairs_compared": collection.pairs_compared,
            "groups_found": collection.groups_found,
        }

    @app.get("/collections/{collection_id}/groups")
    def groups(collection_id: int, s: SessionDep) -> dict[str, Any]:
        if s.get(Collection, collection_id) is None:
            raise HTTPException(404, f"collection {collection_id} does not exist")
        rows = s.execute(
            select(DuplicateGroup.id, Image.id, Image.filename)
            .join(GroupMember, GroupMember.group_id == DuplicateGroup.id)
            .join(Image, Image.id == GroupMember.image_id)
            .where(DuplicateGroup.collection_id == collection_id)
            .order_by(DuplicateGroup.id, Image.id)
        ).all()
        found: dict[int, list[dict[str, Any]]] = {}
        for group_id, image_id, filename in rows:
            found.setdefault(group_id, []).append({"id": image_id, "filename": filename})
        return {"groups": [{"id": g, "images": members} for g, members in found.items()]}

    def get_image(s: Session, image_id: int) -> Image:
        image = s.get(Image, image_id)
        if image is None:
            raise HTTPException(404, f"image {image_id} does not exist")
        return image

    @app.get("/images/{image_id}")
    def image(image_id: int, s: SessionDep) -> dict[str, Any]:
        found = get_image(s, image_id)
        status, error = jobs.image_status(s, found)
        return {
            "id": found.id,
            "collection_id": found.collection_id,
            "filename": found.filename,
            "status": status,
            "error": error,
            "phash": found.phash,
            "dhash": found.dhash,
            "thumbnail": found.thumbnail,
        }

    @app.post("/images/{image_id}/retry")
    def retry(image_id: int, s: SessionDep) -> dict[str, Any]:
        found = get_image(s, image_id)
        if not jobs.retry(s, found):
            raise HTTPException(409, f"image {image_id} has not failed; nothing to retry")
        s.commit()
        jobs.after_retry(found)
        return {"id": found.id, "retrying": True}

    return app

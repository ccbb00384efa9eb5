"""Rubrics by name and version: the presets from package data, custom ones in PostgreSQL."""

from __future__ import annotations

import dataclasses
import json

from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flywheel.core.errors import FailedPrecondition, InvalidArgument, NotFound
from flywheel.reward_judge import rubric as rubrics
from flywheel.reward_judge.models import RubricRow
from flywheel.reward_judge.rubric import Rubric

# A NotFound lists what exists, up to this many names.
MAX_NAMES_LISTED = 50
_INSERT_NEXT = text(
    "INSERT INTO rubrics (name, version, body) "
    "SELECT CAST(:name AS varchar), COALESCE(MAX(version), 0) + 1, CAST(:body AS json) "
    "FROM rubrics WHERE name = CAST(:name AS varchar) "
    "RETURNING version, created_at"
)


def _row_to_rubric(row: RubricRow) -> Rubric:
    r = rubrics.from_dict({**row.body, "version": row.version})
    return dataclasses.replace(r, updated_at=row.created_at)


class RubricStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def get(self, name: str, version: int = 0) -> Rubric:
        """The rubric ``name`` at ``version`` (0: latest); NotFound naming what exists."""
        name = name or "default"
        if version < 0:
            raise InvalidArgument(f"rubric version must be >= 0 (0 for the latest), got {version}")
        if not rubrics.NAME.fullmatch(name):
            # Checked before the query: a megabyte or a NUL byte never reaches PostgreSQL or the message.
            raise InvalidArgument(f"rubric name must match {rubrics.NAME.pattern}, got {name[:80]!r}")
        preset = rubrics.presets().get(name)
        if preset is not None:
            if version not in (0, preset.version):
                raise NotFound(f"preset rubric {name!r} has only version {preset.version}")
            return preset
        async with self._sessions() as s:
            q = select(RubricRow).where(RubricRow.name == name)
            q = q.where(RubricRow.version == version) if version else q.order_by(RubricRow.version.desc()).limit(1)
            row = (await s.execute(q)).scalar_one_or_none()
        if row is None:
            names = sorted(r.name for r in await self.list())
            more = len(names) - MAX_NAMES_LISTED
            known = ", ".join(names[:MAX_NAMES_LISTED]) + (f" and {more} more" if more > 0 else "")
            what = f"rubric {name!r}" + (f" version {version}" if version else "")
            raise NotFound(f"{what} does not exist; known rubrics: {known}")
        return _row_to_rubric(row)

    async def list(self) -> list[Rubric]:
        """The presets, then the latest version of each custom rubric, by name."""
        async with self._sessions() as s:
            latest = select(RubricRow.name, func.max(RubricRow.version).label("v")).group_by(RubricRow.name).subquery()
            rows = (
                (
                    await s.execute(
                        select(RubricRow)
                        .join(latest, (RubricRow.name == latest.c.name) & (RubricRow.version == latest.c.v))
                        .order_by(RubricRow.name)
                    )
                )
                .scalars()
                .all()
            )
        return [*rubrics.presets().values(), *(_row_to_rubric(r) for r in rows)]

    async def put(self, rubric: Rubric) -> Rubric:
        """Store ``rubric`` as the next version. A version given must be exactly the next one."""
        rubrics.validate(rubric)
        if rubric.name in rubrics.presets():
            raise InvalidArgument(f"{rubric.name!r} is a preset and read-only; store your rubric under another name")
        body = rubric.to_dict()
        body.pop("version")
        for _ in range(5):  # two writers racing for the same next version: the loser retries
            try:
                async with self._sessions() as s, s.begin():
                    version, created = (
                        await s.execute(_INSERT_NEXT, {"name": rubric.name, "body": json.dumps(body)})
                    ).one()
                    if rubric.version and version != rubric.version:
                        raise FailedPrecondition(
                            f"rubric {rubric.name!r}: asked to write version {rubric.version} but the next "
                            f"version is {version}; fetch the latest and retry, or send version 0"
                        )
            except IntegrityError:
                continue
            return dataclasses.replace(rubric, version=version, updated_at=created)
        raise FailedPrecondition(f"rubric {rubric.name!r}: too many concurrent writers; retry")

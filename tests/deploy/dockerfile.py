"""A small Dockerfile reader for the image tests: instructions (continuations joined, comments
dropped), stages with their base and name, ARG defaults, and what a target inherits."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    """One FROM ... [AS name] block."""

    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"{self.path.name} has no stage {name!r}")

    def lineage(self, name: str) -> list[Stage]:
        """The stage and the stages it is built FROM, nearest first."""
        chain = [self.stage(name)]
        names = {s.name for s in self.stages}
        while chain[-1].base in names:
            chain.append(self.stage(chain[-1].base))
        return chain

    def root_image(self, name: str) -> str:
        """The image (ARG defaults substituted) that a target's lineage starts from."""
        return self.expand(self.lineage(name)[-1].base)

    def effective(self, name: str, keyword: str) -> str | None:
        """The last value of an inherited setting (USER, ENTRYPOINT, CMD) for a target."""
        for stage in self.lineage(name):
            values = stage.all(keyword)
            if values:
                return values[-1]
        return None

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.global_args.get(m[1] or m[2], m[0]), text)


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) pairs; backslash continuations joined, comment lines dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def parse(path: Path) -> Dockerfile:
    """Read a Dockerfile into its global ARGs and its stages."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, args in instructions(path.read_text()):
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else f"#{len(stages)}"
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if keyword == "ARG" and "=" in args:
                key, _, value = args.partition("=")
                global_args[key.strip()] = value.strip().strip('"')
        else:
            stages[-1].instructions.append((keyword, args))
    return Dockerfile(path, global_args, stages)

"""Generate Python code from protos/ into libs/api/src, or check it is up to date.

    python scripts/proto_gen.py            # regenerate in place
    python scripts/proto_gen.py --check    # exit 1 if the committed code is stale

Uses grpcio-tools' bundled protoc and mypy-protobuf for typed stubs, so the
output depends only on pinned Python packages.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT / "libs" / "api" / "src"
GENERATED_PACKAGE = Path("flywheel") / "api"
# Hand-written modules that live beside the generated code (wire contracts too).
HAND_WRITTEN = {"subjects.py", "tls.py", "ports.py", "values.py"}


def generate(out_root: Path) -> None:
    """Run protoc over every .proto file, writing packages under out_root."""
    import grpc_tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"protoc failed:\n{result.stderr}")
    # Regular packages below flywheel/ (which stays a namespace package).
    for directory in (out_root / GENERATED_PACKAGE).rglob("*"):
        if directory.is_dir():
            (directory / "__init__.py").touch()
    (out_root / GENERATED_PACKAGE / "__init__.py").write_text(
        '"""Flywheel wire contracts: generated protobuf/gRPC code (do not edit: run\n'
        '`task proto:gen`) and the subject catalogue (subjects.py)."""\n'
    )


def differences(a: Path, b: Path) -> list[str]:
    """Relative paths that differ between two trees (ignoring __pycache__)."""
    out: list[str] = []
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__", *HAND_WRITTEN])

    def walk(c: filecmp.dircmp, prefix: str) -> None:
        out.extend(prefix + n for n in c.left_only + c.right_only + c.diff_files)
        for name, sub in c.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(cmp, "")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            stale = differences(Path(tmp) / GENERATED_PACKAGE, OUT_ROOT / GENERATED_PACKAGE)
        if stale:
            print("generated code is stale; run `task proto:gen`:", *stale, sep="\n  ")
            return 1
        print("generated code is up to date")
        return 0
    for sub in (OUT_ROOT / GENERATED_PACKAGE).iterdir():
        if sub.is_dir():
            shutil.rmtree(sub)
    generate(OUT_ROOT)
    print(f"generated {OUT_ROOT / GENERATED_PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

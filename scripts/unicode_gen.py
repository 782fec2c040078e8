"""What the make_unicode_*.py generators share: writing a generated table, or checking it (--check)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_or_check(out, text, check, script, summary):
    """Writes `text` to `out`, printing `summary`; with check, exits non-zero when `out` differs."""
    name = out.relative_to(ROOT)
    if check:
        if out.read_text() != text:
            sys.exit(f"{name} is stale: rerun scripts/{script}")
        print(f"{name} is up to date")
        return
    out.write_text(text)
    print(f"wrote {name}: {summary}")

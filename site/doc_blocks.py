"""The generated parts of the guides: a block between `<!-- BEGIN name -->` and
`<!-- END name -->` is rewritten whole by the script that owns it."""

import re


def fill(text: str, name: str, body: str, where: str) -> str:
    """text with block `name` holding body; a page without the block is an error naming it."""
    pat = re.compile(rf"(<!-- BEGIN {re.escape(name)} -->\n).*?(<!-- END {re.escape(name)} -->)", re.S)
    if not pat.search(text):
        raise SystemExit(f"{where}: no block '{name}'")
    return pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)

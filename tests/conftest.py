"""Where the tests find the read-only shared inputs (`../shared` beside the checkout, or
`TESSEL_SHARED`): `plan predict` reads Megatron-LM's option list through
TESSEL_MEGATRON_ARGUMENTS, set here when the checkout is not beside them (a CI clone)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_CANDIDATES = [Path(os.environ["TESSEL_SHARED"])] if "TESSEL_SHARED" in os.environ else []
_CANDIDATES += [REPO.parent / "shared", Path("/work/shared")]
SHARED = next((p for p in _CANDIDATES if (p / "reference").is_dir()), None)

if SHARED is not None and "TESSEL_MEGATRON_ARGUMENTS" not in os.environ:
    os.environ["TESSEL_MEGATRON_ARGUMENTS"] = str(
        SHARED / "reference" / "megatron_lm_arguments.json")

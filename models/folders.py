"""The user's folders for multiseq, one convention for all: the platform's user folders
(platformdirs: ~/.cache/multiseq on Linux), each overridable by an environment variable."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_DIR_VARIABLE = "MULTISEQ_CACHE_DIR"
APP_NAME = "multiseq"


def cache_dir() -> Path:
    """What can be fetched or built again (models, benchmark tools): $MULTISEQ_CACHE_DIR, else
    the user's cache folder for multiseq."""
    configured = os.environ.get(CACHE_DIR_VARIABLE)
    return Path(configured) if configured else Path(platformdirs.user_cache_dir(APP_NAME))

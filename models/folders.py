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

DATA_DIR_VARIABLE = "MULTISEQ_DATA_DIR"


def data_dir() -> Path:
    """What cannot be made again (the server's uploaded files, batches and their results):
    $MULTISEQ_DATA_DIR, else the user's data folder for multiseq (~/.local/share/multiseq on
    Linux)."""
    configured = os.environ.get(DATA_DIR_VARIABLE)
    return Path(configured) if configured else Path(platformdirs.user_data_dir(APP_NAME))
